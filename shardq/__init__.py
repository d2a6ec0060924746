"""shardq: ordered, per-entity, sharded jobs on SQS FIFO.

Publish with an entity id; each entity's jobs run one after another, in publish
order, while different entities run in parallel across shards, threads and nodes.

The public names are imported on first use, so that ``import shardq`` (and the
command line's first moments, see :mod:`shardq.early`) stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardq.app import App
    from shardq.broker import Broker, MemoryBroker, SqliteBroker
    from shardq.config import Config
    from shardq.errors import (
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
    from shardq.middleware import Middleware, PerformContext, PublishContext
    from shardq.publisher import Job, PublishReport
    from shardq.worker import Worker, WorkerSettings

__version__ = "0.1.0"

#: public name -> the module it comes from
_PUBLIC = {
    "App": "shardq.app",
    "Broker": "shardq.broker",
    "BrokerError": "shardq.errors",
    "Config": "shardq.config",
    "ConfigError": "shardq.errors",
    "DedupIdError": "shardq.errors",
    "EnvelopeError": "shardq.errors",
    "InvalidEntityIdError": "shardq.errors",
    "Job": "shardq.publisher",
    "MemoryBroker": "shardq.broker",
    "Middleware": "shardq.middleware",
    "PayloadError": "shardq.errors",
    "PayloadTooLargeError": "shardq.errors",
    "PerformContext": "shardq.middleware",
    "PermanentError": "shardq.errors",
    "PublishContext": "shardq.middleware",
    "PublishError": "shardq.errors",
    "PublishReport": "shardq.publisher",
    "QueueNotFoundError": "shardq.errors",
    "Retry": "shardq.errors",
    "ShardqError": "shardq.errors",
    "SqliteBroker": "shardq.broker",
    "UnknownWorkerError": "shardq.errors",
    "Worker": "shardq.worker",
    "WorkerDefinitionError": "shardq.errors",
    "WorkerSettings": "shardq.worker",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    try:  # a submodule (``shardq.sharding``) reached as an attribute
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
