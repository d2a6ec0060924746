"""Waiting on the embedded broker: per-queue wake-ups, in this and other processes.

A write to a queue wakes only the waiters of that queue (after its commit). Commits of
other processes are noticed by one thread per broker polling ``PRAGMA data_version``
while anyone waits, then comparing each queue's ``version``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence


class Waiter:
    """One waiting call: its event fires when a watched queue changes or on a wake-up."""

    __slots__ = ("changed", "event", "queues", "woken")

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = tuple(dict.fromkeys(queues))
        self.event = threading.Event()
        self.changed: set[str] = set()  # watched queues written since last taken
        self.woken = False  # by wake_all (shutdown): the wait should end now


class Waiters:
    """The registry of waiting calls of one broker, by queue."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._by_queue: dict[str, set[Waiter]] = {}
        self._all: set[Waiter] = set()
        #: Set while anyone waits (the other-process watcher sleeps otherwise).
        self.busy = threading.Event()
        #: Each queue's ``version`` as last written by this process or seen by the watcher.
        self.known: dict[str, int] = {}
        self.closed = False
        self.stopped = threading.Event()  # set when the broker closes

    def add(self, queues: Sequence[str]) -> Waiter:
        waiter = Waiter(queues)
        with self._mutex:
            if self.closed:
                waiter.woken = True
                waiter.event.set()
            for queue in waiter.queues:
                self._by_queue.setdefault(queue, set()).add(waiter)
            self._all.add(waiter)
            self.busy.set()
        return waiter

    def remove(self, waiter: Waiter) -> None:
        with self._mutex:
            for queue in waiter.queues:
                waiting = self._by_queue.get(queue, set())
                waiting.discard(waiter)
                if not waiting:
                    self._by_queue.pop(queue, None)
            self._all.discard(waiter)
            if not self._all:
                self.busy.clear()

    def notify(self, queues: Iterable[str]) -> None:
        """Wake the waiters of these queues (called after the write committed)."""
        with self._mutex:
            for queue in queues:
                for waiter in self._by_queue.get(queue, ()):
                    waiter.changed.add(queue)
                    waiter.event.set()

    def take_changed(self, waiter: Waiter) -> set[str]:
        """The waiter's queues written since it was registered (or last taken)."""
        with self._mutex:
            changed, waiter.changed = waiter.changed, set()
        return changed

    def wrote(self, queue: str, version: int | None) -> None:
        """Record a version this process committed, then wake the queue's waiters (None:
        nothing to wake them for)."""
        if version is None:
            return
        with self._mutex:
            self.known[queue] = max(version, self.known.get(queue, -1))
        self.notify([queue])

    def wake_all(self, *, closing: bool = False) -> None:
        with self._mutex:
            self.closed = self.closed or closing
            if closing:
                self.stopped.set()
            for waiter in self._all:
                waiter.woken = True
                waiter.event.set()
            self.busy.set()  # lets the watcher thread see ``closed`` at once

    def changed_elsewhere(self, versions: dict[str, int]) -> list[str]:
        """Queues whose version differs from the last one known here; remember them."""
        with self._mutex:
            changed = [q for q, v in versions.items() if self.known.get(q) != v]
            self.known.update(versions)
        return changed


class OtherProcesses(threading.Thread):
    """Polls ``PRAGMA data_version`` of the file and wakes waiters of changed queues."""

    def __init__(self, path: str, waiters: Waiters, poll_interval: float) -> None:
        """Read the current versions here, before any wait relies on the watcher."""
        super().__init__(name="shardq-sqlite-watch", daemon=True)
        self._waiters, self._poll_interval = waiters, poll_interval
        self._db = sqlite3.connect(
            path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._data_version = self._db.execute("PRAGMA data_version").fetchone()[0]
        waiters.changed_elsewhere(self._versions())

    def _versions(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, version FROM queues").fetchall())

    def run(self) -> None:
        waiters, db = self._waiters, self._db
        try:
            while not waiters.closed:
                if not waiters.busy.wait(1.0):
                    continue
                current = db.execute("PRAGMA data_version").fetchone()[0]
                if current != self._data_version:
                    self._data_version = current
                    waiters.notify(waiters.changed_elsewhere(self._versions()))
                waiters.stopped.wait(self._poll_interval)
        except sqlite3.Error:
            return  # a damaged or vanished file: waits end by their timeouts
        finally:
            db.close()
