"""The embedded broker: SQS FIFO semantics on a local SQLite file, durable across
``kill -9`` and shared by node processes on one machine (docs/design/broker.md);
:class:`MemoryBroker` is the same engine in memory, for unit tests. A wait ends on a
write to its queues or another connection's commit (wake-ups: docs/design/broker.md)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

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
    check_receive,
    valid_entries,
)
from shardq.broker.sqlite_dedup import DedupIds
from shardq.broker.sqlite_store import BrokerFile, checkpoint, compact, error, give_back_pages
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.limits import MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES

__all__ = ["MemoryBroker", "SqliteBroker", "compact"]

#: Queues checked per hold of the broker's lock by :meth:`SqliteBroker.watch`.
_WATCH_CHUNK = 200
_T = TypeVar("_T")


class Waiter(threading.Event):
    """One waiting call: set when a watched queue changes or on a wake-up."""

    def __init__(self, queues: Sequence[str], woken: bool) -> None:
        super().__init__()
        self.queues = frozenset(queues)
        self.woken = woken  # by wake_all (shutdown): the wait should end now


class Waiters:
    """The waiting calls of one broker and the thread that watches the file for other
    processes' commits (``data_version``: None in memory)."""

    def __init__(self, data_version: Callable[[], int] | None, poll_interval: float) -> None:
        self._mutex = threading.Lock()
        self._all: set[Waiter] = set()
        self._busy = threading.Event()  # set while anyone waits: the thread sleeps otherwise
        self._closed = threading.Event()
        self._data_version, self._poll_interval = data_version, poll_interval
        self._thread: threading.Thread | None = None

    def add(self, queues: Sequence[str]) -> Waiter:
        """Register a waiting call (before its first look, so no write is missed), and
        start the watching thread unless it runs, from the file's version now."""
        version, seen = self._data_version, None
        if version is not None and not self._closed.is_set() and not self._watching():
            seen = version()  # read before the mutex: it may wait for the file's lock
        with self._mutex:
            if seen is not None and not self._watching():
                self._thread = threading.Thread(
                    target=self._watch,
                    args=(version, seen),
                    name="shardq-sqlite-watch",
                    daemon=True,
                )
                self._thread.start()
            waiter = Waiter(queues, woken=self._closed.is_set())
            self._all.add(waiter)
            self._busy.set()
        return waiter

    def _watching(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def remove(self, waiter: Waiter) -> None:
        with self._mutex:
            self._all.discard(waiter)
            if not self._all:
                self._busy.clear()

    def notify(self, queue: str | None) -> None:
        """Wake the waiters of ``queue`` (None: every waiter), after the write committed."""
        with self._mutex:
            for waiter in self._all:
                if queue is None or queue in waiter.queues:
                    waiter.set()

    def wake_all(self, *, closing: bool = False) -> None:
        """End every wait now (``closing``: and every later one)."""
        with self._mutex:
            if closing:
                self._closed.set()
            for waiter in self._all:
                waiter.woken = True
                waiter.set()
            self._busy.set()  # lets the watching thread see it is closed at once

    def _watch(self, data_version: Callable[[], int], seen: int) -> None:
        try:
            while not self._closed.is_set():
                if not self._busy.wait(1.0):
                    continue
                current = data_version()
                if current != seen:  # another process committed: every waiter looks again
                    seen = current
                    self.notify(None)
                self._closed.wait(self._poll_interval)
        except BrokerError:
            return  # a damaged, vanished or closed file: waits end by their timeouts


class SqliteBroker(Broker):
    """The embedded broker on the SQLite file ``path`` (created if missing); every call is
    one transaction. ``allow_other_tables`` lets it share a file with other applications'
    tables; ``reopen_groups`` and ``stale_visibility`` are test-only."""

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
        self._file = BrokerFile(path, allow_other_tables=allow_other_tables)
        self._dedup = DedupIds()
        in_memory = path == ":memory:"
        self._waiters = Waiters(None if in_memory else self._file.data_version, poll_interval)

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

    def _settings(self, db: sqlite3.Connection, name: str) -> tuple[float, int, int]:
        """The queue's visibility timeout, largest message and deletes so far."""
        row = db.execute(
            "SELECT visibility_timeout, max_message_bytes, deleted FROM queues WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            raise QueueNotFoundError(
                f"queue {name} does not exist in {self.path}; create it with "
                "`shardq queues ensure` or publish through the app"
            )
        return float(row[0]), int(row[1]), int(row[2])

    def delete_queue(self, queue: str) -> None:
        with self._file.write(f"deleting queue {queue}") as db:
            for table, column in (("messages", "queue"), ("groups", "queue"), ("queues", "name")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (queue,))

    def max_message_bytes(self, queue: str) -> int:
        with self._file.read(f"reading queue {queue}") as db:
            return self._settings(db, queue)[1]

    def counts(self, queue: str) -> QueueCounts:
        now = time.time()
        with self._file.read(f"counting queue {queue}") as db:
            deleted = self._settings(db, queue)[2]
            waiting, in_flight, oldest = db.execute(
                "SELECT COALESCE(SUM(visible_at <= :now), 0), COALESCE(SUM(visible_at > :now), 0),"
                " (SELECT sent_at FROM messages WHERE seq = (SELECT MIN(head_seq) FROM groups"
                " WHERE queue = :q)) FROM messages WHERE queue = :q",
                {"q": queue, "now": now},
            ).fetchone()
        return QueueCounts(int(waiting), int(in_flight), oldest, deleted)

    def queue_settings(self, queue: str) -> QueueSettings | None:
        try:
            with self._file.read(f"reading queue {queue}") as db:
                visibility_timeout, max_bytes, _ = self._settings(db, queue)
        except QueueNotFoundError:
            return None
        return QueueSettings(True, int(visibility_timeout), max_bytes, False)

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        result = SendResult()
        with self._file.write(f"sending to queue {queue}") as db:
            max_bytes = self._settings(db, queue)[1]  # (QueueNotFoundError if none)
            valid = valid_entries(entries, lambda: max_bytes, result)
            ids, fresh = self._dedup.claim(db, queue, list({e.dedup_id: 0 for e in valid}))
            new = []
            for entry in valid:
                result.message_ids[entry.id] = ids[entry.dedup_id]
                if entry.dedup_id in fresh:  # the first entry with a new id is stored
                    fresh.discard(entry.dedup_id)
                    new.append((entry, ids[entry.dedup_id]))
            if new:
                fifo.store(db, queue, new, time.time())
        if new:
            self._waiters.notify(queue)
        return result

    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout)

        def take() -> tuple[list[Message], float | None]:
            with self._file.write(f"receiving from queue {queue}") as db:
                self._settings(db, queue)
                stale = self.stale_visibility
                return fifo.take(db, queue, time.time(), max_messages, visibility_timeout, stale)

        if wait_seconds <= 0:
            return take()[0]
        return self._wait([queue], wait_seconds, take)

    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts)
        result = BatchResult()
        with self._file.write(f"deleting from queue {queue}") as db:
            self._settings(db, queue)
            unblocked = fifo.delete(db, queue, receipts, time.time(), result)
        if unblocked:
            self._waiters.notify(queue)
        return result

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        check_batch([r for r, _ in changes])
        result = BatchResult()
        with self._file.write(f"changing visibility in queue {queue}") as db:
            self._settings(db, queue)
            earlier = fifo.change_visibility(
                db, queue, changes, time.time(), result, reopen_groups=self.reopen_groups
            )
        if earlier:
            self._waiters.notify(queue)
        return result

    def _wait(
        self, queues: list[str], seconds: float, look: Callable[[], tuple[list[_T], float | None]]
    ) -> list[_T]:
        """Call ``look`` until it finds something (it returns what, and when something may be
        receivable), ``seconds`` passed or waiters are woken (then: nothing). It looks at
        least once: on a closed broker, that raises."""
        deadline = time.monotonic() + max(0.0, seconds)
        waiter = self._waiters.add(queues)
        try:
            while True:
                waiter.clear()
                found, next_at = look()
                remaining = deadline - time.monotonic()
                if found or remaining <= 0 or waiter.woken:
                    return found
                if next_at is not None:
                    remaining = min(remaining, max(0.0, next_at - time.time()) + 0.001)
                waiter.wait(remaining)
                if waiter.woken:
                    return []
        finally:
            self._waiters.remove(waiter)

    def watch(self, queues: Sequence[str], timeout: float) -> list[str] | None:
        names = list(dict.fromkeys(queues))
        return self._wait(names, timeout, lambda: self._ready(names))

    def _ready(self, queues: list[str]) -> tuple[list[str], float | None]:
        """Queues where a receive could return a message now; else when one could."""
        ready: list[str] = []
        next_at: list[float] = []
        for start in range(0, len(queues), _WATCH_CHUNK):
            with self._file.read("watching queues") as db:
                found, at = fifo.ready(db, json.dumps(queues[start:][:_WATCH_CHUNK]), time.time())
            ready += found
            next_at += [] if at is None else [at]
        return ready, None if ready or not next_at else min(next_at)

    def wake_waiters(self) -> None:
        self._waiters.wake_all()

    def maintain(self) -> None:
        """Drop expired deduplication ids, give free pages back, truncate the WAL, in
        short transactions so other calls are not held up for long."""
        try:
            while True:
                with self._file.write("dropping expired deduplication ids") as db:
                    if not self._dedup.drop_expired(db):
                        break
            while self.path != ":memory:":
                with self._file.write("giving free pages back to the disk") as db:
                    if not give_back_pages(db):
                        break
        finally:  # also when they failed: on a size-limited file only a checkpoint frees the WAL
            if self.path != ":memory:" and not self._file.closed:  # closed: no file I/O
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
