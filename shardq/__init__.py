"""shardq: ordered, per-entity, sharded jobs on SQS FIFO.

Publish with an entity id; each entity's jobs run one after another, in publish
order, while different entities run in parallel across shards, threads and nodes.

The public names are imported on first use, so that ``import shardq`` (and the
command line's first moments, see :mod:`shardq.__main__`) stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardq.api.app import App
    from shardq.api.worker import Worker
    from shardq.broker import Broker, MemoryBroker, SqliteBroker
    from shardq.core.config import Config
    from shardq.core.errors import (
        BrokerError,
        ConfigError,
        DedupIdError,
        EnvelopeError,
        InvalidEntityIdError,
        PayloadError,
        PayloadTooLargeError,
        PermanentError,
        PublishError,
        QueueNotFoundError,
        Retry,
        ShardqError,
        UnknownWorkerError,
        WorkerDefinitionError,
    )
    from shardq.core.jobs import Job, WorkerSettings
    from shardq.core.middleware import Middleware, PerformContext, PublishContext
    from shardq.publish import PublishReport

from shardq.core.version import VERSION as __version__

#: public name -> the module it comes from
_PUBLIC = {
    "App": "shardq.api.app",
    "Broker": "shardq.broker",
    "BrokerError": "shardq.core.errors",
    "Config": "shardq.core.config",
    "ConfigError": "shardq.core.errors",
    "DedupIdError": "shardq.core.errors",
    "EnvelopeError": "shardq.core.errors",
    "InvalidEntityIdError": "shardq.core.errors",
    "Job": "shardq.core.jobs",
    "MemoryBroker": "shardq.broker",
    "Middleware": "shardq.core.middleware",
    "PayloadError": "shardq.core.errors",
    "PayloadTooLargeError": "shardq.core.errors",
    "PerformContext": "shardq.core.middleware",
    "PermanentError": "shardq.core.errors",
    "PublishContext": "shardq.core.middleware",
    "PublishError": "shardq.core.errors",
    "PublishReport": "shardq.publish",
    "QueueNotFoundError": "shardq.core.errors",
    "Retry": "shardq.core.errors",
    "ShardqError": "shardq.core.errors",
    "SqliteBroker": "shardq.broker",
    "UnknownWorkerError": "shardq.core.errors",
    "Worker": "shardq.api.worker",
    "WorkerDefinitionError": "shardq.core.errors",
    "WorkerSettings": "shardq.core.jobs",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    try:  # a submodule (``shardq.core.topology``) reached as an attribute
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module 'shardq' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = [
    "App",
    "Broker",
    "BrokerError",
    "Config",
    "ConfigError",
    "DedupIdError",
    "EnvelopeError",
    "InvalidEntityIdError",
    "Job",
    "MemoryBroker",
    "Middleware",
    "PayloadError",
    "PayloadTooLargeError",
    "PerformContext",
    "PermanentError",
    "PublishContext",
    "PublishError",
    "PublishReport",
    "QueueNotFoundError",
    "Retry",
    "ShardqError",
    "SqliteBroker",
    "UnknownWorkerError",
    "Worker",
    "WorkerDefinitionError",
    "WorkerSettings",
    "__version__",
]
