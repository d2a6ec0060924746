"""Deduplication ids on the embedded broker's file, kept their 5 minutes compactly in
one table per minute of first sends, dropped whole once expired; message ids derived,
not stored (docs/design/broker.md). Runs inside the caller's write transaction."""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
import uuid
from collections.abc import Sequence

from shardq.core.clock import Clock, wall
from shardq.core.limits import DEDUP_WINDOW_SECONDS

#: Seconds of sends per bucket table.
BUCKET_SECONDS = 60
_PREFIX = "shardq_dedup_"
_NAME = re.compile(rf"{_PREFIX}(\d+)")
_BUCKET = """
CREATE TABLE IF NOT EXISTS {table} (
    key BLOB PRIMARY KEY,
    at INTEGER NOT NULL,
    message_id TEXT
) WITHOUT ROWID
"""


def is_bucket_table(name: str) -> bool:
    """True for the name of one of this module's bucket tables."""
    return _NAME.fullmatch(name) is not None


def key_of(queue: str, dedup_id: str) -> bytes:
    """The 16-byte key of a deduplication id on a queue."""
    return hashlib.blake2b(f"{queue}\0{dedup_id}".encode(), digest_size=16).digest()


def _message_id(salt: bytes, key: bytes, bucket: int) -> str:
    """A message id in the form of a random UUID (version 4, RFC 4122 variant)."""
    digest = hashlib.blake2b(key + bucket.to_bytes(8, "big"), key=salt, digest_size=16)
    return str(uuid.UUID(bytes=digest.digest(), version=4))


class DedupIds:
    """The deduplication ids of one broker's file; ``clock``: the time in seconds since
    the epoch."""

    def __init__(self, clock: Clock = wall) -> None:
        self.clock = clock

    def claim(
        self, db: sqlite3.Connection, queue: str, dedup_ids: Sequence[str]
    ) -> tuple[dict[str, str], set[str]]:
        """Record the (distinct) ``dedup_ids`` sent to ``queue`` now: each one's message
        id (the first message's if seen within its window) and the new ones."""
        now = self.clock()
        self.drop_expired(db, now)  # a process that only publishes does not grow the file
        live = [b for b in _buckets(db) if not _expired(b, now)]
        keys = {key_of(queue, d): d for d in dedup_ids}
        salt = bytes(
            db.execute(  # made now for a queue an earlier version created
                "UPDATE queues SET salt = coalesce(salt, randomblob(16)) WHERE name = ?"
                " RETURNING salt",
                (queue,),
            ).fetchone()[0]
        )
        message_ids: dict[str, str] = {}
        for key, bucket, at, stored in _lookup(db, live, list(keys)):
            if bucket * BUCKET_SECONDS + at + DEDUP_WINDOW_SECONDS > now:
                message_ids[keys[key]] = stored or _message_id(salt, key, bucket)
        new = set(dedup_ids) - message_ids.keys()
        if new:
            bucket = int(now // BUCKET_SECONDS)
            at = math.ceil(now) - bucket * BUCKET_SECONDS  # the second of the minute, rounded up
            db.executemany(
                f"INSERT OR REPLACE INTO {_table(db, bucket)} (key, at) VALUES (?, ?)",
                [(key, at) for key, dedup_id in keys.items() if dedup_id in new],
            )
            for key in keys:
                message_ids.setdefault(keys[key], _message_id(salt, key, bucket))
        return message_ids, new

    def drop_expired(self, db: sqlite3.Connection, now: float | None = None) -> bool:
        """Drop the oldest table whose every id has left its window; False if none had."""
        now = self.clock() if now is None else now
        expired = [b for b in _buckets(db) if _expired(b, now)]
        if expired:
            db.execute(f"DROP TABLE {_PREFIX}{min(expired)}")
        return bool(expired)

    def migrate(self, db: sqlite3.Connection) -> None:
        """Move the ids still in their window from the single ``dedup`` table of
        earlier versions (text ids, an expiry index) into buckets; drop that table."""
        rows = db.execute(
            "SELECT queue, dedup_id, message_id, expires_at FROM dedup WHERE expires_at > ?",
            (self.clock(),),
        ).fetchall()
        for queue, dedup_id, message_id, expires_at in rows:
            sent = expires_at - DEDUP_WINDOW_SECONDS
            bucket = int(sent // BUCKET_SECONDS)
            db.execute(
                f"INSERT OR REPLACE INTO {_table(db, bucket)} (key, at, message_id)"
                " VALUES (?, ?, ?)",
                (key_of(queue, dedup_id), math.ceil(sent) - bucket * BUCKET_SECONDS, message_id),
            )
        db.execute("DROP TABLE dedup")


def _buckets(db: sqlite3.Connection) -> list[int]:
    names = db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'shardq_dedup_%'")
    return [int(match.group(1)) for (name,) in names if (match := _NAME.fullmatch(name))]


def _expired(bucket: int, now: float) -> bool:
    return (bucket + 1) * BUCKET_SECONDS + DEDUP_WINDOW_SECONDS <= now


def _table(db: sqlite3.Connection, bucket: int) -> str:
    table = f"{_PREFIX}{bucket}"
    db.execute(_BUCKET.format(table=table))
    return table


def _lookup(
    db: sqlite3.Connection, buckets: list[int], keys: list[bytes]
) -> list[tuple[bytes, int, int, str | None]]:
    if not buckets or not keys:
        return []
    marks = ",".join(f"?{n + 1}" for n in range(len(keys)))
    sql = " UNION ALL ".join(
        f"SELECT key, {b}, at, message_id FROM {_PREFIX}{b} WHERE key IN ({marks})" for b in buckets
    )
    return db.execute(sql, keys).fetchall()
