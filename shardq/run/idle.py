"""The idle watch: shards that look empty wait here until a job may have arrived, then
go back to their lane's inbox (:class:`Pollers` on SQS, a :class:`Watcher` embedded);
and :class:`EmptyCheck`, an until-empty node's question whether every queue is empty.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING

from shardq.core.clock import Clock
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.run.threads import Threads

if TYPE_CHECKING:
    from collections.abc import Callable

    from shardq.broker.base import Broker
    from shardq.run.intake import Intake
    from shardq.run.shard import Inbox, Shard


class Pollers:
    """SQS: one thread per idle shard long-polls it and hands what arrives to its lane.
    At shutdown a poller in its long poll is abandoned; what it brings is released."""

    def __init__(self, intake: Intake, wait_seconds: float, threads: Threads) -> None:
        self.intake, self._wait, self._threads = intake, wait_seconds, threads
        self._lock = threading.Lock()  # lanes add and remove pollers
        self._pollers: dict[int, threading.Event] = {}  # by shard: wakes its poller

    def start(self) -> None:
        """Nothing to start: a poller starts with its shard's first watch."""

    def watch(self, shard: Shard, inbox: Inbox) -> None:
        shard.watched = True
        with self._lock:
            wake = self._pollers.get(id(shard))
            if wake is None:
                wake = self._pollers[id(shard)] = threading.Event()
                name, what = f"shardq-poll-{shard.ref}", f"the poller of {shard.ref}"
                self._threads.start(name, what, partial(self._poll, shard, inbox, wake))
        wake.set()

    def wake(self) -> None:
        """A stopping node: a poller not in a long poll ends at once (a dropped shard's
        poller ends by itself)."""
        with self._lock:
            wakes = list(self._pollers.values())
        for wake in wakes:
            wake.set()

    def unwatch(self, shard: Shard) -> None:
        """``shard`` was dropped: its poller exits (after its long poll, if in one)."""
        with self._lock:
            wake = self._pollers.pop(id(shard), None)
        if wake is not None:
            wake.set()

    def _poll(self, shard: Shard, inbox: Inbox, wake: threading.Event) -> None:
        intake, backoff = self.intake, 0.5
        while not intake.stopping.is_set() and not shard.dropped:
            if not wake.wait(0.5) or shard.dropped:
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
                wake.clear()
                inbox.put((shard, messages, len(messages) == MAX_BATCH_ENTRIES))


class Watcher:
    """Embedded broker: one thread watches every idle shard (``Broker.watch``) and tells
    a shard's lane when a job may have arrived. Rounds last :data:`BUSY_ROUND` while
    shards keep joining, else :data:`IDLE_ROUND` (the first shard to join wakes it)."""

    BUSY_ROUND = 0.05
    IDLE_ROUND = 0.5

    def __init__(self, intake: Intake, threads: Threads) -> None:
        self.intake, self._threads = intake, threads
        self._lock = threading.Lock()
        self._watched: dict[Shard, Inbox] = {}  # a shard and a newer one of its queue may meet
        self._joined = threading.Event()
        self._long_round = False

    def watch(self, shard: Shard, inbox: Inbox) -> None:
        shard.watched = True
        with self._lock:
            self._watched[shard] = inbox
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
                watched = dict.fromkeys(s.queue for s in self._watched)
                queues = [q for q in watched if not intake.backing_off(q)]
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
                found = [(s, inbox) for s, inbox in self._watched.items() if s.queue in arrived]
                for shard, _ in found:
                    del self._watched[shard]
            for shard, inbox in found:
                inbox.put((shard, None, False))


#: Seconds an until-empty node waits to count its queues again after the broker failed to.
COUNTS_RETRY_SECONDS = 10.0


class EmptyCheck:
    """An until-empty node's question, once its lanes are idle: is every queue empty?"""

    def __init__(
        self,
        broker: Broker,
        queues: Callable[[], list[str]],
        trouble: Callable[[str, str | None, BaseException], None],
        clock: Clock,
    ) -> None:
        self._broker, self._queues, self._trouble, self._clock = broker, queues, trouble, clock
        self._busy = ""  # the queue that held jobs last time: asked first
        self._next = 0.0  # after a failed count, when to ask again

    def drained(self) -> bool:
        if self._clock() < self._next:
            return False
        for queue in sorted(self._queues(), key=lambda q: q != self._busy):
            try:
                counts = self._broker.counts(queue)
            except QueueNotFoundError:
                continue  # nobody created it: nothing was ever published there
            except BrokerError as exc:  # logged; asked again later
                self._trouble("counts", queue, exc)
                self._next = self._clock() + COUNTS_RETRY_SECONDS
                return False
            if counts.waiting or counts.in_flight:
                self._busy = queue
                return False
        return True
