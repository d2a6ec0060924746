"""The state store (see :mod:`shardq.store.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardq.core.config import store_parameters
from shardq.store.base import DamagedItem, Item, Store, StoreConflict, StoreError
from shardq.store.sqlite import MemoryStore, SqliteStore

if TYPE_CHECKING:
    from shardq.broker.base import Broker
    from shardq.core.config import Config

__all__ = [
    "DamagedItem",
    "Item",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "store_for",
]


def store_for(config: Config, broker: Broker) -> Store:
    """Memory for the in-memory broker; DynamoDB for ``store_url`` or ``sqs://`` (SQS's
    region, endpoint and timeouts by default); the embedded broker's SQLite file; else memory."""
    from shardq.broker.sqlite import SqliteBroker

    if broker.kind == "memory":  # its queues end with the process (tests): so does their state
        return MemoryStore()
    if config.store_url is not None or broker.kind == "sqs":
        from shardq.broker.sqs import SqsBroker  # imports boto3
        from shardq.store.dynamo import TABLE_SUFFIX, DynamoStore

        query = store_parameters(config.store_url or "dynamodb://", config.source)
        region, endpoint, unanswered = config.region, config.endpoint_url, None
        timeouts = config.connect_timeout, config.read_timeout
        if isinstance(broker, SqsBroker):  # where the broker's SQS is (it may be given in code)
            region, endpoint = broker.client.meta.region_name, broker.endpoint_url
            unanswered = broker.unanswered  # one memory of hung endpoints
            timeouts = broker.connect_timeout, broker.read_timeout
        return DynamoStore(
            query.get("table", config.queue_prefix + TABLE_SUFFIX),
            region=query.get("region", region),
            endpoint_url=query.get("endpoint_url", endpoint),
            unanswered=unanswered,
            connect_timeout=timeouts[0],
            read_timeout=timeouts[1],
        )
    if broker.kind == "sqlite" and isinstance(broker, SqliteBroker):
        return SqliteStore(broker.path, config.queue_prefix)
    return MemoryStore()
