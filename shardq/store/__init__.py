"""The state store (see :mod:`shardq.store.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardq.store.base import Item, Store, StoreConflict, StoreError
from shardq.store.memory import MemoryStore
from shardq.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from shardq.broker.base import Broker
    from shardq.config import Config

__all__ = [
    "Item",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "store_for",
]


def store_for(config: Config, broker: Broker) -> Store:
    """The store an app uses with ``broker``: the same SQLite file for the embedded
    broker, DynamoDB for ``sqs://``, memory for ``memory://``."""
    from shardq.broker.sqlite import SqliteBroker

    if broker.kind == "sqlite" and isinstance(broker, SqliteBroker):
        return SqliteStore(broker.path)
    return MemoryStore()  # DynamoDB for sqs:// is not there yet
