"""Deduplication ids on the embedded broker's file, kept their 5 minutes compactly.

Each id is a row (a 16-byte hash of queue and id, the second of the minute it was sent)
of a table ``shardq_dedup_<minute>`` for the minute of its first send; a table is dropped
whole once all its ids left their window. A new message's id is derived from the
queue's ``salt``, the key and the minute, so a duplicate gets it back without storing
it. Runs inside the caller's write transaction (see docs/design/broker.md).
"""

from __future__ import annotations

import hashlib
import math
import re
import sqlite3
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
    raw = bytearray(
        hashlib.blake2b(key + bucket.to_bytes(8, "big"), key=salt, digest_size=16).digest()
    )
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    x = raw.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


class DedupIds:
    """The deduplication ids of one broker's file; ``clock``: the time in seconds since
    the epoch."""

    def __init__(self, clock: Clock = wall) -> None:
        self.clock = clock

    def claim(
        self, db: sqlite3.Connection, queue: str, dedup_ids: Sequence[str]
    ) -> tuple[dict[str, str], set[str]]:
        """Record the (distinct) ``dedup_ids`` sent to ``queue`` now: each one's message
        id (the first message's if seen within its window) and the new ones. Drops an
        expired bucket on the way (a process that only publishes does not grow the file)."""
        now = self.clock()
        self.purge(db, now, limit=1)
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
            rows = [(key, math.ceil(now) - bucket * BUCKET_SECONDS) for key in keys]
            db.executemany(
                f"INSERT OR REPLACE INTO {_table(db, bucket)} (key, at) VALUES (?, ?)",
                [row for row in rows if keys[row[0]] in new],
            )
            for key in keys:
                message_ids.setdefault(keys[key], _message_id(salt, key, bucket))
        return message_ids, new

    def purge(self, db: sqlite3.Connection, now: float | None = None, limit: int = 0) -> int:
        """Drop bucket tables whose every id has left its window (``limit`` of them
        at most, 0: all); how many were dropped."""
        now = self.clock() if now is None else now
        expired = sorted(b for b in _buckets(db) if _expired(b, now))[: limit or None]
        for bucket in expired:
            db.execute(f"DROP TABLE {_PREFIX}{bucket}")
        return len(expired)

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
    """The rows of these keys in these buckets."""
    if not buckets or not keys:
        return []
    marks = ",".join(f"?{n + 1}" for n in range(len(keys)))
    sql = " UNION ALL ".join(
        f"SELECT key, {b}, at, message_id FROM {_PREFIX}{b} WHERE key IN ({marks})" for b in buckets
    )
    return db.execute(sql, keys).fetchall()
