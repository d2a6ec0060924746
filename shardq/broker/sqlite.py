"""The embedded broker: SQS FIFO semantics on a local SQLite file.

* Durable across ``kill -9`` (WAL journal, every call is one transaction).
* Safe for several node processes on one machine (``BEGIN IMMEDIATE`` plus a busy
  timeout serialise writers).
* A receive that waits wakes as soon as a message may be receivable: at once for
  writes from this process; within ``poll_interval`` (25 ms) for writes from other
  processes, which one background thread per broker notices by polling SQLite's
  ``PRAGMA data_version`` (a counter read, not a query of the queues); and when the
  earliest invisible message of the queue becomes visible again.

:class:`MemoryBroker` is the same engine on an in-memory database: no file, for
unit tests.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from shardq.broker.base import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
    check_batch,
    check_send_batch,
    entry_problem,
)
from shardq.errors import BrokerError, QueueNotFoundError
from shardq.limits import (
    DEDUP_WINDOW_SECONDS,
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_VISIBILITY_SECONDS,
    MIN_MESSAGE_BYTES,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    visibility_timeout REAL NOT NULL,
    max_message_bytes INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    group_id TEXT NOT NULL,
    body TEXT NOT NULL,
    message_id TEXT NOT NULL,
    sent_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    received_at REAL,
    receive_count INTEGER NOT NULL DEFAULT 0,
    token TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages (queue, seq);
CREATE INDEX IF NOT EXISTS messages_by_group ON messages (queue, group_id, visible_at);
CREATE INDEX IF NOT EXISTS messages_by_visibility ON messages (queue, visible_at);
CREATE TABLE IF NOT EXISTS dedup (
    queue TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
"""

# "+visible_at" keeps SQLite from using messages_by_visibility here: it must walk
# messages_by_queue in seq order and stop after :n rows, not sort the whole queue
# (which made receives slower the longer the backlog).
_RECEIVE = """
SELECT seq, group_id, body, message_id, sent_at, receive_count FROM messages AS m
WHERE queue = :q AND +visible_at <= :now
  AND NOT EXISTS (
    SELECT 1 FROM messages AS x
    WHERE x.queue = :q AND x.group_id = m.group_id AND x.visible_at > :now)
ORDER BY seq LIMIT :n
"""

_DEDUP_PURGE_EVERY = 60.0


class SqliteBroker(Broker):
    """The embedded broker on the SQLite file ``path`` (created if missing)."""

    kind = "sqlite"

    def __init__(self, path: str, *, poll_interval: float = 0.025) -> None:
        self.path = path
        self._poll_interval = poll_interval
        self._lock = threading.RLock()
        try:
            self._db = self._connect()
        except sqlite3.Error as exc:
            raise BrokerError(
                f"cannot open the embedded broker file {path} ({exc}); check that its "
                "directory exists and is writable"
            ) from exc
        self._queue_cache: dict[str, tuple[float, int]] = {}
        self._changed = threading.Condition()
        self._versions: dict[str, int] = {}
        self._waiters = 0
        self._wakeups = 0
        self._closed = False
        self._watcher: threading.Thread | None = None
        self._next_dedup_purge = 0.0

    # -- connection ---------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 30000")
        if self.path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(queues)")}
        if "deleted" not in columns:  # a file made by shardq 0.1.0
            db.execute("ALTER TABLE queues ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0")
        return db

    def _tx(self) -> _Tx:
        if self._closed:
            raise BrokerError(f"the embedded broker on {self.path} is closed")
        return _Tx(self._lock, self._db)

    # -- queues -------------------------------------------------------------
    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        size = MAX_MESSAGE_BYTES if max_message_bytes is None else max_message_bytes
        if not MIN_MESSAGE_BYTES <= size <= MAX_MESSAGE_BYTES:
            raise BrokerError(
                f"max_message_bytes {size} for queue {name} is outside "
                f"{MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES}"
            )
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO queues (name, visibility_timeout, max_message_bytes)"
                " VALUES (?, ?, ?)",
                (name, float(visibility_timeout), size),
            )

    def _queue(self, db: sqlite3.Connection, name: str) -> tuple[float, int]:
        cached = self._queue_cache.get(name)
        if cached is not None:
            return cached
        row = db.execute(
            "SELECT visibility_timeout, max_message_bytes FROM queues WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise QueueNotFoundError(
                f"queue {name} does not exist in {self.path}; create it with "
                "`shardq queues ensure` or publish through the app"
            )
        self._queue_cache[name] = (float(row[0]), int(row[1]))
        return self._queue_cache[name]

    def max_message_bytes(self, queue: str) -> int:
        with self._tx() as db:
            return self._queue(db, queue)[1]

    def counts(self, queue: str) -> QueueCounts:
        now = time.time()
        with self._tx() as db:
            self._queue(db, queue)
            waiting, in_flight, oldest = db.execute(
                "SELECT COALESCE(SUM(visible_at <= :now), 0), COALESCE(SUM(visible_at > :now), 0),"
                " MIN(sent_at) FROM messages WHERE queue = :q",
                {"q": queue, "now": now},
            ).fetchone()
            (deleted,) = db.execute(
                "SELECT deleted FROM queues WHERE name = ?", (queue,)
            ).fetchone()
        return QueueCounts(int(waiting), int(in_flight), oldest, int(deleted))

    def queue_settings(self, queue: str) -> QueueSettings | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT visibility_timeout, max_message_bytes FROM queues WHERE name = ?", (queue,)
            ).fetchone()
        if row is None:
            return None
        return QueueSettings(True, int(row[0]), int(row[1]), False)

    # -- send ---------------------------------------------------------------
    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        check_send_batch(entries)
        result = SendResult()
        now = time.time()
        with self._tx() as db:
            _, max_bytes = self._queue(db, queue)
            if now >= self._next_dedup_purge:
                db.execute("DELETE FROM dedup WHERE expires_at <= ?", (now,))
                self._next_dedup_purge = now + _DEDUP_PURGE_EVERY
            for entry in entries:
                reason = entry_problem(entry, max_bytes)
                if reason:
                    result.failed[entry.id] = reason
                    continue
                seen = db.execute(
                    "SELECT message_id FROM dedup WHERE queue = ? AND dedup_id = ?"
                    " AND expires_at > ?",
                    (queue, entry.dedup_id, now),
                ).fetchone()
                if seen is not None:
                    result.message_ids[entry.id] = seen[0]
                    continue
                message_id = str(uuid.uuid4())
                db.execute(
                    "INSERT INTO messages (queue, group_id, body, message_id, sent_at, visible_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (queue, entry.group_id, entry.body, message_id, now, now),
                )
                db.execute(
                    "INSERT OR REPLACE INTO dedup (queue, dedup_id, message_id, expires_at)"
                    " VALUES (?, ?, ?, ?)",
                    (queue, entry.dedup_id, message_id, now + DEDUP_WINDOW_SECONDS),
                )
                result.message_ids[entry.id] = message_id
            if result.message_ids:
                self._bump(db, queue)
        return result

    # -- receive ------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
            raise BrokerError(f"max_messages {max_messages} is outside 1..{MAX_BATCH_ENTRIES}")
        if not 0 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
            raise BrokerError(f"visibility_timeout {visibility_timeout} is outside 0..43200")
        deadline = time.monotonic() + max(0.0, wait_seconds)
        woken = False
        while True:
            seen = self._version(queue)
            messages, next_visible = self._receive_now(queue, max_messages, visibility_timeout)
            remaining = deadline - time.monotonic()
            if messages or remaining <= 0 or self._closed or woken:
                return messages
            if next_visible is not None:
                remaining = min(remaining, max(0.0, next_visible - time.time()) + 0.001)
            woken = self._wait_for_change(queue, seen, remaining)

    def _receive_now(
        self, queue: str, max_messages: int, visibility_timeout: float
    ) -> tuple[list[Message], float | None]:
        now = time.time()
        with self._tx() as db:
            self._queue(db, queue)
            rows = db.execute(_RECEIVE, {"q": queue, "now": now, "n": max_messages}).fetchall()
            if not rows:
                nxt = db.execute(
                    "SELECT MIN(visible_at) FROM messages WHERE queue = ? AND visible_at > ?",
                    (queue, now),
                ).fetchone()[0]
                return [], nxt
            messages = []
            for seq, group_id, body, message_id, sent_at, count in rows:
                token = secrets.token_hex(8)
                db.execute(
                    "UPDATE messages SET visible_at = ?, received_at = ?, token = ?,"
                    " receive_count = receive_count + 1 WHERE seq = ?",
                    (now + visibility_timeout, now, token, seq),
                )
                messages.append(
                    Message(
                        queue=queue,
                        message_id=message_id,
                        receipt=f"{seq}.{token}",
                        body=body,
                        group_id=group_id,
                        receive_count=count + 1,
                        sent_at=sent_at,
                        sequence=f"{seq:020d}",
                        received_at=now,
                    )
                )
        return messages, None

    # -- delete and visibility ----------------------------------------------
    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts, list(receipts))
        result = BatchResult()
        now = time.time()
        with self._tx() as db:
            self._queue(db, queue)
            for receipt in receipts:
                key = _parse_receipt(receipt)
                cur = None
                if key is not None:
                    cur = db.execute(
                        "DELETE FROM messages WHERE seq = ? AND token = ? AND queue = ?"
                        " AND visible_at > ?",
                        (key[0], key[1], queue, now),
                    )
                if cur is None or cur.rowcount != 1:
                    result.failed[receipt] = _STALE
            if len(result.failed) < len(receipts):
                self._bump(db, queue, deleted=len(receipts) - len(result.failed))
        return result

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        check_batch(changes, [r for r, _ in changes])
        result = BatchResult()
        now = time.time()
        with self._tx() as db:
            self._queue(db, queue)
            for receipt, seconds in changes:
                key = _parse_receipt(receipt)
                if not 0 <= seconds <= MAX_VISIBILITY_SECONDS:
                    result.failed[receipt] = f"visibility {seconds} is outside 0..43200 seconds"
                    continue
                if key is None:
                    result.failed[receipt] = _STALE
                    continue
                row = db.execute(
                    "SELECT received_at FROM messages WHERE seq = ? AND token = ? AND queue = ?"
                    " AND visible_at > ?",
                    (key[0], key[1], queue, now),
                ).fetchone()
                if row is None:
                    result.failed[receipt] = _STALE
                elif now + seconds > row[0] + MAX_VISIBILITY_SECONDS:
                    result.failed[receipt] = "visibility would exceed 12 hours after the receive"
                else:
                    db.execute(
                        "UPDATE messages SET visible_at = ? WHERE seq = ?", (now + seconds, key[0])
                    )
            self._bump(db, queue)
        return result

    # -- waiting ------------------------------------------------------------
    def _bump(self, db: sqlite3.Connection, queue: str, deleted: int = 0) -> None:
        """Record a change of ``queue`` for waiters here and in other processes."""
        db.execute(
            "UPDATE queues SET version = version + 1, deleted = deleted + ? WHERE name = ?",
            (deleted, queue),
        )
        with self._changed:
            self._versions[queue] = self._versions.get(queue, 0) + 1
            self._changed.notify_all()

    def _version(self, queue: str) -> int:
        with self._changed:
            return self._versions.get(queue, 0)

    def wake_waiters(self) -> None:
        with self._changed:
            self._wakeups += 1
            self._changed.notify_all()

    def _wait_for_change(self, queue: str, seen: int, timeout: float) -> bool:
        """Wait until ``queue`` may have changed; True if woken by :meth:`wake_waiters`."""
        with self._changed:
            self._waiters += 1
            wakeups = self._wakeups
            try:
                self._start_watcher()
                self._changed.wait_for(
                    lambda: (
                        self._closed
                        or self._wakeups != wakeups
                        or self._versions.get(queue, 0) != seen
                    ),
                    timeout,
                )
                return self._wakeups != wakeups
            finally:
                self._waiters -= 1

    def _start_watcher(self) -> None:
        if self.path == ":memory:" or (self._watcher and self._watcher.is_alive()):
            return
        self._watcher = threading.Thread(
            target=self._watch_other_processes, name="shardq-sqlite-watch", daemon=True
        )
        self._watcher.start()

    def _watch_other_processes(self) -> None:
        """Notice commits of other processes and wake the waiters of changed queues."""
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            data_version = None
            known: dict[str, int] = {}
            while not self._closed:
                with self._changed:
                    if self._waiters == 0:
                        self._changed.wait(1.0)
                        continue
                current = db.execute("PRAGMA data_version").fetchone()[0]
                if current != data_version:
                    data_version = current
                    rows = dict(db.execute("SELECT name, version FROM queues").fetchall())
                    changed = [q for q, v in rows.items() if known.get(q) != v]
                    known = rows
                    if changed:
                        with self._changed:
                            for q in changed:
                                self._versions[q] = self._versions.get(q, 0) + 1
                            self._changed.notify_all()
                time.sleep(self._poll_interval)
        finally:
            db.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        with self._lock:
            self._db.close()


class MemoryBroker(SqliteBroker):
    """The embedded broker's engine on an in-memory database: same FIFO semantics, no
    file, nothing shared between processes. Meant for unit tests."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__(":memory:")


_STALE = "receipt handle is invalid or expired (the message is visible again or was deleted)"


class _Tx:
    """One serialised ``BEGIN IMMEDIATE`` transaction on the broker's connection."""

    def __init__(self, lock: threading.RLock, db: sqlite3.Connection) -> None:
        self._lock, self._db = lock, db

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise BrokerError(f"embedded broker is unavailable: {exc}") from exc
        return self._db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self._lock.release()


def _parse_receipt(receipt: str) -> tuple[int, str] | None:
    seq, _, token = receipt.partition(".")
    if not seq.isdigit() or not token:
        return None
    return int(seq), token
