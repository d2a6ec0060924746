"""The state store as a table of the embedded broker's file (``{queue_prefix}shardq_state``:
apps sharing a file keep apart states, as they keep apart queues), or in memory; one
connection (set up as the broker's) behind a lock, each write one ``BEGIN IMMEDIATE``."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import structlog

from shardq.broker.sqlite_store import STATE_TABLE, connect, error, transaction, use_wal
from shardq.core.limits import QUEUE_NAME_PATTERN
from shardq.store import base
from shardq.store.base import Item, Store, StoreConflict, StoreError

log = structlog.get_logger("shardq.store")


class SqliteStore(Store):
    kind = "sqlite"

    def __init__(self, path: str, queue_prefix: str = "") -> None:
        if queue_prefix and not QUEUE_NAME_PATTERN.fullmatch(queue_prefix):
            raise ValueError(f"queue_prefix {queue_prefix!r}: use letters, digits, - and _")
        self.path, self.table = path, queue_prefix + STATE_TABLE
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._db = connect(path)
            use_wal(self._db, path)
            with transaction(self._db, path, "opening the state store", error_type=StoreError):
                _create(self._db, self.table, queue_prefix)
        except (sqlite3.Error, StoreError) as exc:
            with suppress(AttributeError):
                self._db.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(str(error(path, exc, "opening the state store"))) from exc

    @contextmanager
    def _tx(self, doing: str, *, write: bool) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise StoreError(f"the state store on {self.path} is closed; make a new one")
            begin = "BEGIN IMMEDIATE" if write else "BEGIN"
            with transaction(self._db, self.path, doing, begin=begin, error_type=StoreError) as db:
                yield db

    def get(self, key: str) -> Item | None:
        base.namespace(key)
        with self._tx(f"reading state item {key!r}", write=False) as db:
            sql = f'SELECT value, version FROM "{self.table}" WHERE key = ?'
            row = db.execute(sql, (key,)).fetchone()
        return None if row is None else base.item(key, row[0], row[1])

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        base.namespace(key)
        text = base.encode(value)
        with self._tx(f"writing state item {key!r}", write=True) as db:
            current = _version(db, self.table, key)
            if current != version:
                raise StoreConflict(base.conflict(key, version, current))
            new = 1 if current is None else current + 1
            db.execute(
                f'INSERT OR REPLACE INTO "{self.table}" (key, value, version) VALUES (?, ?, ?)',
                (key, text, new),
            )
        return Item(key, json.loads(text), new)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        base.namespace(key)
        with self._tx(f"deleting state item {key!r}", write=True) as db:
            current = _version(db, self.table, key)
            if version is not None and current != version:
                raise StoreConflict(base.conflict(key, version, current))
            if current is None:
                return False
            db.execute(f'DELETE FROM "{self.table}" WHERE key = ?', (key,))
        return True

    def query(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int = base.MAX_QUERY_ITEMS,
        keep_damaged: bool = False,
    ) -> list[Item]:
        base.namespace(prefix)
        limit = max(0, min(limit, base.MAX_QUERY_ITEMS))
        sql = f'SELECT key, value, version FROM "{self.table}" WHERE key >= ? AND key > ?'
        args: list[Any] = [prefix, start_after or ""]
        end = _prefix_end(prefix)
        if end is not None:  # a range the primary key's index serves
            sql, args = sql + " AND key < ?", [*args, end]
        sql += " AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?"
        args += [len(prefix), prefix, limit]
        with self._tx(f"querying state items under {prefix!r}", write=False) as db:
            rows = db.execute(sql, args).fetchall()
        return [base.item(k, v, n, keep_damaged=keep_damaged) for k, v, n in rows]

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()


class MemoryStore(SqliteStore):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__(":memory:")


def _version(db: sqlite3.Connection, table: str, key: str) -> Any:
    """The item's version (None: no item); a hand edit's non-int conflicts with every write."""
    row = db.execute(f'SELECT version FROM "{table}" WHERE key = ?', (key,)).fetchone()
    return None if row is None else row[0]


def _create(db: sqlite3.Connection, table: str, queue_prefix: str) -> None:
    """The app's table, made if missing. Earlier versions kept every app's state in
    ``shardq_state``: an app of another prefix starts from a copy of it (kept as it was:
    an app of the default prefix may have used it too), but for the dead jobs of other
    apps' queues, so that a dead job is requeued by one app only."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if table in tables:
        return
    if clash := [t for t in tables if t.lower() == table.lower()]:  # SQLite ignores case
        raise StoreError(
            f"queue_prefix {queue_prefix!r} differs only in case from that of another app of "
            f"{clash[0]!r}: its state would be the same table; use another queue_prefix"
        )
    db.execute(
        f'CREATE TABLE "{table}" (key TEXT PRIMARY KEY, value TEXT NOT NULL,'
        " version INTEGER NOT NULL) WITHOUT ROWID"
    )
    if STATE_TABLE not in tables or table == STATE_TABLE:
        return
    rows = db.execute(f"SELECT key, value, version FROM {STATE_TABLE}").fetchall()
    others = {_dead_job_of(k) for k, v, _ in rows if _foreign(k, v, queue_prefix)}
    kept = [r for r in rows if _dead_job_of(r[0]) not in others]
    db.executemany(f'INSERT INTO "{table}" (key, value, version) VALUES (?, ?, ?)', kept)
    if kept:
        log.info(
            "store.adopted",
            table=table,
            items=len(kept),
            detail=f"this queue_prefix's state starts from the items of {STATE_TABLE}, where "
            "earlier versions kept it for every app of the file (but other apps' dead jobs)",
        )


def _dead_job_of(key: str) -> tuple[str, str] | None:
    """(worker, death stamp) of a morgue item (``morgue/W/e/ENC/STAMP``,
    ``morgue/W/t/STAMP/ENC``, ``morgue/W/p/STAMP/K``: :mod:`shardq.morgue.record`)."""
    parts = key.split("/")
    if len(parts) != 5 or parts[0] != "morgue" or parts[2] not in ("e", "t", "p"):
        return None
    return parts[1], parts[4 if parts[2] == "e" else 3]


def _foreign(key: str, value: str, queue_prefix: str) -> bool:
    """Whether a dead job's record item says it died in a queue of another prefix."""
    if _dead_job_of(key) is None or key.split("/")[2] != "e":
        return False
    try:
        source = json.loads(value).get("source_queue")
    except (ValueError, AttributeError):
        return False  # unreadable: copied, so that no app loses sight of it
    return isinstance(source, str) and bool(source) and not source.startswith(queue_prefix)


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: none)."""
    last = ord(prefix[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates cannot be stored: skip them
        last = 0xE000
    return None if last > 0x10FFFF else prefix[:-1] + chr(last)
