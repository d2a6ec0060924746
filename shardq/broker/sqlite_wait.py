"""Waiting on the embedded broker: per-queue wake-ups, in this and other processes.

A write to a queue wakes only the waiters of that queue (after its commit). Commits of
other connections (other processes, and this one's state store) are noticed by one thread
per broker polling ``PRAGMA data_version`` while anyone waits; they wake every waiter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from shardq.core.errors import BrokerError


class Waiter:
    """One waiting call: its event fires when a watched queue changes or on a wake-up."""

    __slots__ = ("event", "queues", "woken")

    def __init__(self, queues: Sequence[str], woken: bool) -> None:
        self.queues = frozenset(queues)
        self.event = threading.Event()
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
                    waiter.event.set()

    def wake_all(self, *, closing: bool = False) -> None:
        """End every wait now (``closing``: and every later one)."""
        with self._mutex:
            if closing:
                self._closed.set()
            for waiter in self._all:
                waiter.woken = True
                waiter.event.set()
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
