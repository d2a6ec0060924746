"""The state store (see :mod:`shardq.store.base`)."""

from shardq.store.base import Item, Store, StoreConflict, StoreError
from shardq.store.memory import MemoryStore

__all__ = ["Item", "MemoryStore", "Store", "StoreConflict", "StoreError"]
