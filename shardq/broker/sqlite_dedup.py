"""Deduplication ids on the embedded broker's file: kept their 5 minutes, compactly.

SQS drops a message whose deduplication id was seen on its queue within the last
5 minutes, even if the first message was deleted since, and returns the first
message's id. So every id sent must be kept 5 minutes: after a burst of 100,000
jobs that is 100,000 rows, and they must neither take much room nor cost much to
purge.

* Each id seen is one row of a bucket table ``shardq_dedup_<minute>`` (the minute,
  counted from the epoch, in which it was first sent). A row is a 16-byte BLAKE2b
  hash of the queue and the id (the key), the seconds into the minute at which it
  was sent (rounded up: an id is kept up to 1 s longer than 5 minutes, never
  shorter), and a message id that is null unless the row came from a file of an
  earlier version: about 27 bytes a row, whatever the id's length.
* The message id of a new message is derived from the queue's random ``salt``, the
  key and the minute, so a duplicate send returns it without it being stored. Two
  sends accepted as new with the same id on one queue are more than 5 minutes
  apart, hence in different minutes, hence get different message ids.
* A bucket whose every id has left its window is dropped whole (``DROP TABLE``):
  no expiry index, no row-by-row deletes, and its pages are free at once for
  maintenance to give back to the disk.

Everything here runs inside the caller's write transaction.
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
    """The deduplication ids of one broker's file (one instance per connection).

    ``clock`` gives the time in seconds since the epoch (tests move it on).
    """

    def __init__(self, clock: Clock = wall) -> None:
        self.clock = clock
        self._buckets: set[int] = set()
        self._schema = -1  # the schema_version self._buckets was read at
        self._salts: dict[str, bytes] = {}

    def claim(
        self, db: sqlite3.Connection, queue: str, dedup_ids: Sequence[str]
    ) -> tuple[dict[str, str], set[str]]:
        """Record the (distinct) ``dedup_ids`` sent to ``queue`` now.

        Returns each id's message id (the first message's for an id seen within its
        window) and the ids that are new. Drops an expired bucket on the way, so a
        process that only publishes does not grow the file either.
        """
        now = self.clock()
        self.purge(db, now, limit=1)  # re-reads the buckets first if the schema changed
        keys = {key_of(queue, d): d for d in dedup_ids}
        salt = self._salt(db, queue)
        message_ids: dict[str, str] = {}
        for key, bucket, at, stored in self._lookup(db, list(keys), now):
            if bucket * BUCKET_SECONDS + at + DEDUP_WINDOW_SECONDS > now:
                message_ids[keys[key]] = stored or _message_id(salt, key, bucket)
        new = set(dedup_ids) - message_ids.keys()
        if new:
            bucket = int(now // BUCKET_SECONDS)
            at = math.ceil(now) - bucket * BUCKET_SECONDS
            table = self._table(db, bucket)
            rows = [(key, at) for key, d in keys.items() if d in new]
            db.executemany(f"INSERT OR REPLACE INTO {table} (key, at) VALUES (?, ?)", rows)
            for key, _ in rows:
                message_ids[keys[key]] = _message_id(salt, key, bucket)
        return message_ids, new

    def purge(self, db: sqlite3.Connection, now: float | None = None, limit: int = 0) -> int:
        """Drop bucket tables whose every id has left its window (``limit`` of them
        at most, 0: all); how many were dropped."""
        now = self.clock() if now is None else now
        self._load(db)
        expired = sorted(b for b in self._buckets if self._expired(b, now))
        for bucket in expired[:limit] if limit else expired:
            db.execute(f"DROP TABLE IF EXISTS {_PREFIX}{bucket}")
            self._buckets.discard(bucket)
            self._schema = -1  # re-read next time: the transaction may yet roll back
        return len(expired[:limit] if limit else expired)

    def migrate(self, db: sqlite3.Connection) -> None:
        """Move the ids still in their window from the single ``dedup`` table of
        earlier versions (text ids, an expiry index) into buckets; drop that table."""
        now = self.clock()
        self._load(db)
        rows = db.execute(
            "SELECT queue, dedup_id, message_id, expires_at FROM dedup WHERE expires_at > ?",
            (now,),
        ).fetchall()
        by_bucket: dict[int, list[tuple[bytes, int, str]]] = {}
        for queue, dedup_id, message_id, expires_at in rows:
            sent = expires_at - DEDUP_WINDOW_SECONDS
            bucket = int(sent // BUCKET_SECONDS)
            at = math.ceil(sent) - bucket * BUCKET_SECONDS
            by_bucket.setdefault(bucket, []).append((key_of(queue, dedup_id), at, message_id))
        for bucket, found in by_bucket.items():
            db.executemany(
                f"INSERT OR REPLACE INTO {self._table(db, bucket)} (key, at, message_id)"
                " VALUES (?, ?, ?)",
                found,
            )
        db.execute("DROP TABLE dedup")
        self._schema = -1

    # -- internals ----------------------------------------------------------
    def _load(self, db: sqlite3.Connection) -> None:
        """Re-read the bucket tables if the schema changed (another process, or a
        connection of this one, made or dropped one)."""
        version = _schema_version(db)
        if version == self._schema:
            return
        self._buckets = {
            int(match.group(1))
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ?",
                (f"{_PREFIX}%",),
            )
            if (match := _NAME.fullmatch(name))
        }
        self._schema = version

    def _table(self, db: sqlite3.Connection, bucket: int) -> str:
        table = f"{_PREFIX}{bucket}"
        if bucket not in self._buckets:
            db.execute(_BUCKET.format(table=table))
            self._buckets.add(bucket)
            self._schema = -1  # re-read next time: the transaction may yet roll back
        return table

    def _lookup(
        self, db: sqlite3.Connection, keys: list[bytes], now: float
    ) -> list[tuple[bytes, int, int, str | None]]:
        """The rows of these keys in every bucket that may hold ids in their window."""
        live = sorted(b for b in self._buckets if not self._expired(b, now))
        if not live or not keys:
            return []
        marks = ",".join(f"?{n + 1}" for n in range(len(keys)))
        sql = " UNION ALL ".join(
            f"SELECT key, {b}, at, message_id FROM {_PREFIX}{b} WHERE key IN ({marks})"
            for b in live
        )
        return db.execute(sql, keys).fetchall()

    @staticmethod
    def _expired(bucket: int, now: float) -> bool:
        return (bucket + 1) * BUCKET_SECONDS + DEDUP_WINDOW_SECONDS <= now

    def _salt(self, db: sqlite3.Connection, queue: str) -> bytes:
        """The queue's salt for message ids (made now for a queue an earlier version
        created; kept in memory only once committed)."""
        salt = self._salts.get(queue)
        if salt is None:
            (stored,) = db.execute("SELECT salt FROM queues WHERE name = ?", (queue,)).fetchone()
            if stored is not None:
                salt = self._salts[queue] = bytes(stored)
            else:
                salt = bytes(
                    db.execute(
                        "UPDATE queues SET salt = randomblob(16) WHERE name = ? RETURNING salt",
                        (queue,),
                    ).fetchone()[0]
                )
        return salt


def _schema_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA schema_version").fetchone()[0])
