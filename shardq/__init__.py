"""shardq: ordered, per-entity, sharded jobs on SQS FIFO.

Publish with an entity id; each entity's jobs run one after another, in publish
order, while different entities run in parallel across shards, threads and nodes.
The public names are imported on first use, so that ``import shardq`` stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ``X as X``: re-exported for type checkers
    from shardq.api.app import App as App
    from shardq.api.worker import Worker as Worker
    from shardq.broker import Broker as Broker
    from shardq.broker import MemoryBroker as MemoryBroker
    from shardq.broker import SqliteBroker as SqliteBroker
    from shardq.core.config import Config as Config
    from shardq.core.errors import BrokerError as BrokerError
    from shardq.core.errors import ConfigError as ConfigError
    from shardq.core.errors import DedupIdError as DedupIdError
    from shardq.core.errors import EnvelopeError as EnvelopeError
    from shardq.core.errors import InvalidEntityIdError as InvalidEntityIdError
    from shardq.core.errors import PayloadError as PayloadError
    from shardq.core.errors import PayloadTooLargeError as PayloadTooLargeError
    from shardq.core.errors import PermanentError as PermanentError
    from shardq.core.errors import PublishError as PublishError
    from shardq.core.errors import QueueNotFoundError as QueueNotFoundError
    from shardq.core.errors import Retry as Retry
    from shardq.core.errors import ShardqError as ShardqError
    from shardq.core.errors import UnknownWorkerError as UnknownWorkerError
    from shardq.core.errors import WorkerDefinitionError as WorkerDefinitionError
    from shardq.core.jobs import Job as Job
    from shardq.core.jobs import WorkerSettings as WorkerSettings
    from shardq.core.middleware import Middleware as Middleware
    from shardq.core.middleware import PerformContext as PerformContext
    from shardq.core.middleware import PublishContext as PublishContext
    from shardq.publish import PublishReport as PublishReport

from shardq.core.version import VERSION as __version__  # noqa: F401 (in __all__)

#: public name -> the module it comes from
_PUBLIC = {
    name: module
    for module, names in {
        "shardq.api.app": "App",
        "shardq.api.worker": "Worker",
        "shardq.broker": "Broker MemoryBroker SqliteBroker",
        "shardq.core.config": "Config",
        "shardq.core.errors": "BrokerError ConfigError DedupIdError EnvelopeError "
        "InvalidEntityIdError PayloadError PayloadTooLargeError PermanentError PublishError "
        "QueueNotFoundError Retry ShardqError UnknownWorkerError WorkerDefinitionError",
        "shardq.core.jobs": "Job WorkerSettings",
        "shardq.core.middleware": "Middleware PerformContext PublishContext",
        "shardq.publish": "PublishReport",
    }.items()
    for name in names.split()
}
__all__ = sorted([*_PUBLIC, "__version__"])


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
