"""A state store in this process's memory (tests, ``memory://`` apps)."""

from __future__ import annotations

from shardq.store.sqlite import SqliteStore


class MemoryStore(SqliteStore):
    """The embedded store's engine on an in-memory database: the same semantics, no
    file, nothing shared with other processes."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__(":memory:")
