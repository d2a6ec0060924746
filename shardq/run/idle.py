"""The idle watch: shards that look empty wait here until a job may have arrived, then
go back to their lane's inbox (:class:`Pollers` on SQS, a :class:`Watcher` embedded).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from shardq.core.errors import BrokerError
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.run.threads import Threads

if TYPE_CHECKING:
    from shardq.run.intake import Intake
    from shardq.run.lane import Lane
    from shardq.run.shard import Shard


class Pollers:
    """SQS: one thread per idle shard long-polls it and hands what arrives to its lane.
    At shutdown a poller in its long poll is abandoned; what it brings is released."""

    def __init__(self, intake: Intake, wait_seconds: float, threads: Threads) -> None:
        self.intake, self._wait, self._threads = intake, wait_seconds, threads
        self._lock = threading.Lock()  # lanes add and remove pollers
        self._pollers: dict[int, _Poller] = {}  # by shard
        self._started: list[_Poller] = []  # every poller not known to have ended

    def start(self) -> None:
        """Nothing to start: a poller starts with its shard's first watch."""

    def watch(self, shard: Shard, lane: Lane) -> None:
        shard.watched = True
        with self._lock:
            poller = self._pollers.get(id(shard))
            if poller is None:
                poller = self._pollers[id(shard)] = _Poller(self.intake, shard, lane, self._wait)
                self._started = [p for p in self._started if p.running()]
                self._started.append(poller)
                name, what = f"shardq-poll-{shard.ref}", f"the poller of {shard.ref}"
                poller.thread = self._threads.start(name, what, poller.run)
        poller.wake.set()

    def wake(self) -> None:
        """A stopping node: a poller not in a long poll ends at once."""
        with self._lock:
            pollers = list(self._started)
        for poller in pollers:
            poller.wake.set()

    def unwatch(self, shard: Shard) -> None:
        """``shard`` was dropped: its poller exits (after its long poll, if in one)."""
        with self._lock:
            poller = self._pollers.pop(id(shard), None)
        if poller is not None:
            poller.wake.set()


class _Poller:
    def __init__(self, intake: Intake, shard: Shard, lane: Lane, wait_seconds: float) -> None:
        self.intake, self.shard, self.lane, self._wait = intake, shard, lane, wait_seconds
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def running(self) -> bool:
        return self.thread is None or self.thread.is_alive()

    def run(self) -> None:
        intake, shard, backoff = self.intake, self.shard, 0.5
        while not intake.stopping.is_set() and not shard.dropped:
            if not self.wake.wait(0.5) or shard.dropped:
                continue
            messages = intake.receive(shard, wait_seconds=self._wait)
            if messages is None:  # the broker failed (logged; back off), or the node stops
                intake.stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            if intake.stopping.is_set() or shard.dropped:
                intake.release_straggler(messages)
                return
            if messages:
                self.wake.clear()
                self.lane.inbox.put((shard, messages, len(messages) == MAX_BATCH_ENTRIES))


class Watcher:
    """Embedded broker: one thread watches every idle shard (``Broker.watch``) and tells
    a shard's lane when a job may have arrived. Rounds last :data:`BUSY_ROUND` while
    shards keep joining, else :data:`IDLE_ROUND` (the first shard to join wakes it)."""

    BUSY_ROUND = 0.05
    IDLE_ROUND = 0.5

    def __init__(self, intake: Intake, threads: Threads) -> None:
        self.intake, self._threads = intake, threads
        self._lock = threading.Lock()
        self._watched: dict[Shard, Lane] = {}  # a shard and a newer one of its queue may meet
        self._joined = threading.Event()
        self._long_round = False

    def watch(self, shard: Shard, lane: Lane) -> None:
        shard.watched = True
        with self._lock:
            self._watched[shard] = lane
            wake, self._long_round = self._long_round, False
        self._joined.set()
        if wake:
            self.intake.broker.wake_waiters()

    def unwatch(self, shard: Shard) -> None:
        """``shard`` was dropped: watch it no more."""
        with self._lock:
            self._watched.pop(shard, None)

    def start(self) -> None:
        self._threads.start("shardq-watch", "the idle watch", self._run)

    def wake(self) -> None:
        """A stopping node: the watch ends at once (also one waiting on the broker)."""
        self._joined.set()
        self.intake.broker.wake_waiters()

    def _run(self) -> None:
        intake, backoff = self.intake, 0.5
        while not intake.stopping.is_set():
            busy = self._joined.is_set()
            self._joined.clear()
            with self._lock:
                queues = list(dict.fromkeys(s.queue for s in self._watched))
                self._long_round = not busy
            if not queues:
                self._joined.wait(0.5)
                continue
            seconds = self.BUSY_ROUND if busy else self.IDLE_ROUND
            try:
                ready = intake.broker.watch(queues, seconds)
            except BrokerError as exc:
                intake.broker_trouble("watch", None, exc)
                intake.stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            arrived = set(ready or ())
            with self._lock:
                found = [(s, lane) for s, lane in self._watched.items() if s.queue in arrived]
                for shard, _ in found:
                    del self._watched[shard]
            for shard, lane in found:
                lane.inbox.put((shard, None, False))
