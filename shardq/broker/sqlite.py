"""The embedded broker: SQS FIFO semantics on a local SQLite file.

* Durable across ``kill -9`` (WAL journal, every call is one transaction: a call
  that fails stored nothing; see :class:`~shardq.broker.sqlite_store.BrokerFile`).
* Safe for several node processes on one machine (``BEGIN IMMEDIATE`` plus a busy
  timeout serialise writers).
* Every SQLite error becomes a :class:`~shardq.core.errors.BrokerError` naming the file
  and what to do (a full disk says so).
* A receive costs the same on any queue: it walks the heads of the queue's message
  groups (see :mod:`shardq.broker.sqlite_store`), not the messages behind a blocked
  head, so no call holds the broker's lock for long.
* A receive that waits wakes as soon as a message may be receivable: at once for
  writes of its queue from this process (only that queue's waiters are woken);
  within ``poll_interval`` (25 ms) for writes from other processes (see
  :mod:`shardq.broker.sqlite_wait`); and when a blocked group's visibility ends.
  :meth:`SqliteBroker.watch` waits on many queues at once the same way.
* Deduplication ids are kept their 5 minutes in one table per minute of sends,
  dropped whole once expired (see :mod:`shardq.broker.sqlite_dedup`).
* :meth:`SqliteBroker.maintain` (the node calls it about every 30 s) drops expired
  deduplication buckets, gives freed pages back to the disk and truncates the WAL;
  :func:`compact` rewrites a file by hand.

:class:`MemoryBroker` is the same engine on an in-memory database: no file, for
unit tests.

Test-only modes that emulate other emulators (``reopen_groups``,
``stale_visibility``): see :mod:`shardq.broker.sqlite_fifo`. Never use them in production.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence

from shardq.broker import sqlite_fifo as fifo
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
from shardq.broker.sqlite_dedup import DedupIds
from shardq.broker.sqlite_store import BrokerFile, checkpoint, compact, error, give_back_pages
from shardq.broker.sqlite_wait import OtherProcesses, Waiters
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.limits import (
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_VISIBILITY_SECONDS,
    MIN_MESSAGE_BYTES,
)

__all__ = ["MemoryBroker", "SqliteBroker", "compact"]

#: Queues checked per hold of the broker's lock by :meth:`SqliteBroker.watch`.
_WATCH_CHUNK = 200


class SqliteBroker(Broker):
    """The embedded broker on the SQLite file ``path`` (created if missing).

    ``allow_other_tables`` lets it share a file that holds other applications'
    tables (refused by default, so a mistyped ``broker_url`` cannot quietly add
    shardq's tables to an application database). ``reopen_groups`` and
    ``stale_visibility`` are test-only (see :mod:`shardq.broker.sqlite_fifo`).
    """

    kind = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        poll_interval: float = 0.025,
        reopen_groups: bool = False,
        stale_visibility: bool = False,
        allow_other_tables: bool = False,
    ) -> None:
        self.path = path
        self.reopen_groups = reopen_groups
        self.stale_visibility = stale_visibility
        self._poll_interval = poll_interval
        self._file = BrokerFile(path, allow_other_tables=allow_other_tables)
        self._queue_cache: dict[str, tuple[float, int]] = {}
        self._dedup = DedupIds()
        self._waiters = Waiters()
        self._watcher: OtherProcesses | None = None

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
        with self._file.write(f"creating queue {name}") as db:
            db.execute(
                "INSERT OR IGNORE INTO queues (name, visibility_timeout, max_message_bytes, salt)"
                " VALUES (?, ?, ?, randomblob(16))",
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

    def delete_queue(self, queue: str) -> None:
        with self._file.write(f"deleting queue {queue}") as db:
            db.execute("DELETE FROM messages WHERE queue = ?", (queue,))
            db.execute("DELETE FROM groups WHERE queue = ?", (queue,))
            db.execute("DELETE FROM queues WHERE name = ?", (queue,))
        self._queue_cache.pop(queue, None)

    def max_message_bytes(self, queue: str) -> int:
        with self._file.read(f"reading queue {queue}") as db:
            return self._queue(db, queue)[1]

    def counts(self, queue: str) -> QueueCounts:
        now = time.time()
        with self._file.read(f"counting queue {queue}") as db:
            self._queue(db, queue)
            waiting, in_flight = db.execute(
                "SELECT COALESCE(SUM(visible_at <= :now), 0), COALESCE(SUM(visible_at > :now), 0)"
                " FROM messages WHERE queue = :q",
                {"q": queue, "now": now},
            ).fetchone()
            oldest = db.execute(
                "SELECT MIN(sent_at) FROM messages WHERE seq ="
                " (SELECT MIN(head_seq) FROM groups WHERE queue = ?)",
                (queue,),
            ).fetchone()[0]
            row = db.execute("SELECT deleted FROM queues WHERE name = ?", (queue,)).fetchone()
        if row is None:  # deleted by another process since this one looked it up
            self._queue_cache.pop(queue, None)
            raise QueueNotFoundError(f"queue {queue} was deleted from {self.path}")
        return QueueCounts(int(waiting), int(in_flight), oldest, int(row[0]))

    def queue_settings(self, queue: str) -> QueueSettings | None:
        with self._file.read(f"reading queue {queue}") as db:
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
        version = None
        with self._file.write(f"sending to queue {queue}") as db:
            _, max_bytes = self._queue(db, queue)
            fresh = []
            for entry in entries:
                reason = entry_problem(entry, max_bytes)
                if reason:
                    result.failed[entry.id] = reason
                else:
                    fresh.append(entry)
            if fresh:
                self._store(db, queue, fresh, now, result)
            if result.message_ids:
                version = self._bump(db, queue)
        if version is not None:
            self._waiters.wrote({queue: version})
        return result

    def _store(
        self,
        db: sqlite3.Connection,
        queue: str,
        entries: list[SendEntry],
        now: float,
        result: SendResult,
    ) -> None:
        """Store the entries whose deduplication id is new, in order, with their groups."""
        ids, fresh = self._dedup.claim(db, queue, list(dict.fromkeys(e.dedup_id for e in entries)))
        new: list[tuple[SendEntry, str]] = []
        for entry in entries:
            if entry.dedup_id in fresh:  # the first entry with this id
                fresh.discard(entry.dedup_id)
                new.append((entry, ids[entry.dedup_id]))
            result.message_ids[entry.id] = ids[entry.dedup_id]
        if new:
            fifo.store(db, queue, new, now)

    # -- receive ------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
            raise BrokerError(f"max_messages {max_messages} is outside 1..{MAX_BATCH_ENTRIES}")
        if not 0 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
            raise BrokerError(f"visibility_timeout {visibility_timeout} is outside 0..43200")
        if wait_seconds <= 0:
            return self._receive_now(queue, max_messages, visibility_timeout)[0]
        deadline = time.monotonic() + wait_seconds
        waiter = self._waiters.add([queue])  # before the first look: no write is missed
        try:
            self._start_watcher()
            while True:
                waiter.event.clear()
                messages, next_visible = self._receive_now(queue, max_messages, visibility_timeout)
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0 or waiter.woken:
                    return messages
                if next_visible is not None:
                    remaining = min(remaining, max(0.0, next_visible - time.time()) + 0.001)
                waiter.event.wait(remaining)
        finally:
            self._waiters.remove(waiter)

    def _receive_now(
        self, queue: str, max_messages: int, visibility_timeout: float
    ) -> tuple[list[Message], float | None]:
        now = time.time()
        with self._file.write(f"receiving from queue {queue}") as db:
            self._queue(db, queue)
            return fifo.take(
                db,
                queue,
                now,
                max_messages,
                visibility_timeout,
                stale_visibility=self.stale_visibility,
            )

    # -- delete and visibility ----------------------------------------------
    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts, list(receipts))
        result = BatchResult()
        now = time.time()
        with self._file.write(f"deleting from queue {queue}") as db:
            self._queue(db, queue)
            deleted, unblocked = fifo.delete(
                db, queue, receipts, now, result, reopen_groups=self.reopen_groups
            )
            version = None
            if deleted:
                count = len(receipts) - len(result.failed)
                version = self._bump(db, queue, count, wake=unblocked)
        if version is not None and unblocked:
            self._waiters.wrote({queue: version})
        return result

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        check_batch(changes, [r for r, _ in changes])
        result = BatchResult()
        now = time.time()
        with self._file.write(f"changing visibility in queue {queue}") as db:
            self._queue(db, queue)
            earlier = fifo.change_visibility(
                db, queue, changes, now, result, reopen_groups=self.reopen_groups
            )
            version = self._bump(db, queue, wake=earlier) if earlier else None
        if version is not None:
            self._waiters.wrote({queue: version})
        return result

    # -- waiting ------------------------------------------------------------
    def _bump(
        self, db: sqlite3.Connection, queue: str, deleted: int = 0, *, wake: bool = True
    ) -> int:
        """Count deletes; if ``wake``, record a change of ``queue`` for waiters here and in
        other processes (they are woken after the commit). The queue's version."""
        row = db.execute(
            "UPDATE queues SET version = version + ?, deleted = deleted + ? WHERE name = ?"
            " RETURNING version",
            (int(wake), deleted, queue),
        ).fetchone()
        if row is None:  # deleted by another process since this one looked it up
            self._queue_cache.pop(queue, None)
            raise QueueNotFoundError(f"queue {queue} was deleted from {self.path}")
        return int(row[0])

    def watch(self, queues: Sequence[str], timeout: float) -> list[str] | None:
        names = list(dict.fromkeys(queues))
        deadline = time.monotonic() + max(0.0, timeout)
        waiter = self._waiters.add(names)
        try:
            self._start_watcher()
            while True:
                waiter.event.clear()
                if waiter.woken:
                    return []
                ready, next_at = self._ready(names)
                changed = self._waiters.take_changed(waiter)
                if waiter.woken:
                    return []
                if ready or changed:
                    found = ready | changed
                    return [q for q in names if q in found]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if next_at is not None:
                    remaining = min(remaining, max(0.0, next_at - time.time()) + 0.001)
                waiter.event.wait(remaining)
        finally:
            self._waiters.remove(waiter)

    def _ready(self, queues: list[str]) -> tuple[set[str], float | None]:
        """Queues where a receive could return a message now; else when one could."""
        ready: set[str] = set()
        next_at: float | None = None
        for start in range(0, len(queues), _WATCH_CHUNK):
            chunk, now = json.dumps(queues[start : start + _WATCH_CHUNK]), time.time()
            with self._file.read("watching queues") as db:
                ready.update(fifo.ready(db, chunk, now))
                if not ready:
                    at = fifo.next_ready(db, chunk, now)
                    if at is not None and (next_at is None or at < next_at):
                        next_at = at
        return ready, next_at

    def wake_waiters(self) -> None:
        self._waiters.wake_all()

    def _start_watcher(self) -> None:
        if self.path == ":memory:" or self._file.closed:
            return
        if self._watcher and self._watcher.is_alive():
            return
        with self._file.lock:
            if self._watcher is None or not self._watcher.is_alive():
                try:
                    self._watcher = OtherProcesses(self.path, self._waiters, self._poll_interval)
                except sqlite3.Error as exc:
                    raise error(self.path, exc, "watching it for other processes") from exc
                self._watcher.start()

    # -- housekeeping -------------------------------------------------------
    def maintain(self) -> None:
        """Drop expired deduplication ids, give free pages back, truncate the WAL.

        Works in short transactions so other calls are not held up for long.
        """
        while True:
            with self._file.write("dropping expired deduplication ids") as db:
                if not self._dedup.purge(db, limit=1):
                    break
        if self.path == ":memory:":
            return
        while True:
            with self._file.write("giving free pages back to the disk") as db:
                if not give_back_pages(db):
                    break
        try:
            checkpoint(self.path)
        except sqlite3.Error as exc:
            raise error(self.path, exc, "checkpointing its WAL") from exc

    def close(self) -> None:
        self._waiters.wake_all(closing=True)
        self._file.close()


class MemoryBroker(SqliteBroker):
    """The embedded broker's engine on an in-memory database: same FIFO semantics, no
    file, nothing shared between processes. Meant for unit tests."""

    kind = "memory"

    def __init__(self, *, reopen_groups: bool = False, stale_visibility: bool = False) -> None:
        super().__init__(":memory:", reopen_groups=reopen_groups, stale_visibility=stale_visibility)
