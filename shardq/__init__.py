"""shardq: ordered, per-entity, sharded jobs on SQS FIFO.

Publish with an entity id; each entity's jobs run one after another, in publish
order, while different entities run in parallel across shards, threads and nodes.
"""

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
