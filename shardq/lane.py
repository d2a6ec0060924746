"""A lane: one node thread serving its own shards, with its receives overlapped.

A lane keeps up to ``prefetch`` receives in flight (in the node's I/O pool) for the
shards that may have work, chosen by the scheduler, while it runs the batch in
hand. Settles go to the node's :class:`~shardq.leases.Leases` and are sent in the
background. So a lane waits on a round trip only when it has nothing else to run.

Per-entity order does not depend on this: a receive never returns a job of an
entity while an earlier job of that entity is held (in flight), and the lane runs
each batch's entities in order (:class:`~shardq.executor.Executor`).

A shard whose receive returned fewer than 10 messages may be empty: it goes to the
node's idle watch (:class:`Pollers` long-poll each idle shard on SQS; a
:class:`Watcher` thread watches every idle shard of an embedded broker at once) and
comes back when a job arrives.
"""

from __future__ import annotations

import heapq
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from shardq.broker.base import Message
from shardq.errors import BrokerError
from shardq.executor import Deferred, Executor, Tally
from shardq.limits import MAX_BATCH_ENTRIES
from shardq.plan import ShardRef
from shardq.scheduler import Scheduler, ShardView

if TYPE_CHECKING:
    from shardq.node import Node

log = structlog.get_logger("shardq.node")


@dataclass(eq=False)
class Shard:
    """A shard as its lane sees it."""

    ref: ShardRef
    queue: str
    visibility_timeout: int
    batches: deque[list[Message]] = field(default_factory=deque)  # received, not started
    more: bool = False  # may have work: worth a receive
    fetching: int = 0  # receives in flight
    watched: bool = False  # idle: the idle watch has it
    head_sent_at: float | None = None  # sent time of the oldest job believed waiting
    last_served: int = 0


#: What reaches a lane's inbox: a shard and what a receive found (None: "may have
#: work", from the embedded watcher), and whether the receive came back full.
Found = tuple[Shard, "list[Message] | None", bool]


class Lane(threading.Thread):
    """One node thread: runs its shards' batches one at a time, receives overlapped."""

    def __init__(self, node: Node, index: int, shards: list[Shard], rng: random.Random) -> None:
        super().__init__(name=f"shardq-lane-{index}", daemon=True)
        self.node = node
        self.shards = shards
        self.inbox: queue.SimpleQueue[Found] = queue.SimpleQueue()
        self.tally = Tally()
        self.current: list[Message] = []
        self.failed = False
        self.deferred: list[tuple[float, int, Deferred]] = []
        self._scheduler = Scheduler(rng)
        self._executor = Executor(
            node.app, node.leases, node.limits, node.stopping, [self.tally, *node.observers]
        )
        self._picks = 0
        self._in_flight = 0
        self._in_hand = 0  # received batches not started, over all the lane's shards

    def run(self) -> None:
        try:
            self._serve()
        except BaseException:
            self.failed = True
            log.exception(
                "node.lane_failed",
                lane=self.name,
                detail="stopping the node; its jobs are released or reappear",
            )
            self.node.stop()

    def _serve(self) -> None:
        for shard in self.shards:  # the idle watch finds out which shards have work
            self.node.idle.watch(shard, self)
        while not self.node.stopping.is_set():
            self._collect(self._next_due())
            if self.node.stopping.is_set():
                return
            self._prefetch()
            picked = self._pick([s for s in self.shards if s.batches])
            if picked is None:
                continue
            shard = picked
            batch = shard.batches.popleft()
            self._in_hand -= 1
            shard.head_sent_at = shard.batches[0][0].sent_at if shard.batches else None
            self._prefetch()
            self.current = batch
            try:
                for item in self._executor.run_batch(shard.ref, batch):
                    self._defer(item)
            finally:
                self.current = []
            self._settle_idle(shard)

    # -- what the lane holds ------------------------------------------------------
    def idle(self) -> bool:
        return (
            not self.current
            and not self.deferred
            and self._in_flight == 0
            and self.inbox.empty()
            and all(s.watched and not s.batches for s in self.shards)
        )

    # -- receiving ------------------------------------------------------------------
    def _prefetch(self) -> None:
        """Keep up to ``prefetch`` receives in flight for shards that may have work, and
        no more than ``prefetch`` + 1 batches received and not started in the lane."""
        limit = self.node.config.prefetch
        while self._in_flight < limit and self._in_flight + self._in_hand <= limit:
            candidates = [
                s for s in self.shards if s.more and s.fetching < limit and len(s.batches) < 2
            ]
            shard = self._pick(candidates)
            if shard is None:
                return
            shard.fetching += 1
            self._in_flight += 1
            self.node.pool.submit(self._fetch, shard)

    def _fetch(self, shard: Shard) -> None:
        """In a pool thread: one receive without waiting, handed back to the lane."""
        messages: list[Message] | None = None
        try:
            messages = self.node.receive(shard, wait_seconds=self.node.app.broker.prefetch_wait)
            if self.node.stopping.is_set():  # the node may have swept what it holds
                self.node.release_straggler(messages)
                messages = None
        except BaseException as exc:
            self.node.fail(f"a receive for {shard.ref}", exc)
        finally:
            found = messages or []
            self.inbox.put((shard, found, len(found) == MAX_BATCH_ENTRIES))

    def _collect(self, timeout: float) -> None:
        """Take what receives and the idle watch found; wait up to ``timeout`` for the
        first if there is nothing to run."""
        block = not any(s.batches for s in self.shards) and timeout > 0
        try:
            item = self.inbox.get(timeout=timeout) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._found(*item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _found(self, shard: Shard, messages: list[Message] | None, full: bool) -> None:
        if messages is None:  # the embedded watcher: it may have work
            shard.watched, shard.more = False, True
            return
        if shard.fetching:  # our own receive (a poller's is not counted)
            shard.fetching -= 1
            self._in_flight -= 1
        else:
            shard.watched = False
        if messages:
            shard.batches.append(messages)
            self._in_hand += 1
            if shard.head_sent_at is None:
                shard.head_sent_at = messages[0].sent_at
        shard.more = full
        self._settle_idle(shard)

    def _settle_idle(self, shard: Shard) -> None:
        """A shard with nothing in hand, in flight or known to wait goes to the idle watch."""
        idle = not (shard.more or shard.fetching or shard.batches or shard.watched)
        if idle and not self.node.stopping.is_set():
            self.node.idle.watch(shard, self)

    # -- choosing -------------------------------------------------------------------
    def _pick(self, shards: list[Shard]) -> Shard | None:
        if not shards:
            return None
        now = time.time()
        views = [
            ShardView(
                s,
                s.ref.priority,
                now - s.head_sent_at if s.head_sent_at else 0.0,
                ready=True,
                last_served=s.last_served,
            )
            for s in shards
        ]
        picked = self._scheduler.pick(views)
        if picked is None:
            return None
        self._picks += 1
        picked.key.last_served = self._picks
        return picked.key

    # -- local retries ----------------------------------------------------------------
    def _defer(self, item: Deferred) -> None:
        heapq.heappush(self.deferred, (item.due, id(item), item))

    def _next_due(self) -> float:
        """Run the deferred retries that are due; seconds until the next one (<= 0.5)."""
        while self.deferred and self.deferred[0][0] <= time.monotonic():
            _, _, item = heapq.heappop(self.deferred)
            if self.node.stopping.is_set():
                self._defer(item)
                return 0.0
            self.current = item.messages
            try:
                for again in self._executor.run_batch(item.ref, item.messages):
                    self._defer(again)
            finally:
                self.current = []
        if not self.deferred:
            return 0.5
        return max(0.0, min(0.5, self.deferred[0][0] - time.monotonic()))


class Pollers:
    """SQS: one thread per idle shard long-polls it (one request per ``idle_wait_seconds``,
    180 per hour at 20 s) and hands what arrives to the shard's lane.

    At shutdown a poller still in its long poll is abandoned, not waited for: a job
    that poll receives afterwards is never run here; it is released at once if the
    process still runs, else it reappears after its visibility timeout.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self._threads: dict[int, _Poller] = {}

    def watch(self, shard: Shard, lane: Lane) -> None:
        shard.watched = True
        poller = self._threads.get(id(shard))
        if poller is None:
            poller = self._threads[id(shard)] = _Poller(self.node, shard, lane)
            poller.start()
        poller.wake.set()

    def alive(self) -> bool:
        pollers = list(self._threads.values())  # lanes add pollers meanwhile
        return all(p.is_alive() for p in pollers) or self.node.stopping.is_set()


class _Poller(threading.Thread):
    def __init__(self, node: Node, shard: Shard, lane: Lane) -> None:
        super().__init__(name=f"shardq-poll-{shard.ref}", daemon=True)
        self.node, self.shard, self.lane = node, shard, lane
        self.wake = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.node.fail(f"the poller of {self.shard.ref}", exc)

    def _run(self) -> None:
        node, backoff = self.node, 0.5
        while not node.stopping.is_set():
            if not self.wake.wait(0.5):
                continue
            messages = node.receive(self.shard, wait_seconds=node.config.idle_wait_seconds)
            if messages is None:  # the broker failed: logged; back off
                node.stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            if node.stopping.is_set():
                node.release_straggler(messages)
                return
            if messages:
                self.wake.clear()
                self.lane.inbox.put((self.shard, messages, len(messages) == MAX_BATCH_ENTRIES))


class Watcher(threading.Thread):
    """Embedded broker: one thread watches every idle shard of the node at once
    (``Broker.watch``) and tells a shard's lane when a job may have arrived.

    While shards keep joining, a round lasts :data:`BUSY_ROUND` (a newly idle shard
    waits at most that long to be watched); when none joined during a round, the
    next lasts :data:`IDLE_ROUND`, and the first shard that joins wakes it at once.
    """

    BUSY_ROUND = 0.05
    IDLE_ROUND = 0.5

    def __init__(self, node: Node) -> None:
        super().__init__(name="shardq-watch", daemon=True)
        self.node = node
        self._lock = threading.Lock()
        self._watched: dict[str, tuple[Shard, Lane]] = {}
        self._joined = threading.Event()
        self._long_round = False

    def watch(self, shard: Shard, lane: Lane) -> None:
        shard.watched = True
        with self._lock:
            self._watched[shard.queue] = (shard, lane)
            wake, self._long_round = self._long_round, False
        self._joined.set()
        if wake:
            self.node.app.broker.wake_waiters()

    def alive(self) -> bool:
        return self.is_alive() or self.node.stopping.is_set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.node.fail("the idle watch", exc)

    def _run(self) -> None:
        node, backoff = self.node, 0.5
        while not node.stopping.is_set():
            busy = self._joined.is_set()
            self._joined.clear()
            with self._lock:
                queues = list(self._watched)
                self._long_round = not busy
            if not queues:
                self._joined.wait(0.5)
                continue
            try:
                ready = node.app.broker.watch(
                    queues, self.BUSY_ROUND if busy else self.IDLE_ROUND
                )
            except BrokerError as exc:
                node.broker_trouble("watch", None, exc)
                node.stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            with self._lock:
                found = [self._watched.pop(q) for q in ready or () if q in self._watched]
            for shard, lane in found:
                lane.inbox.put((shard, None, False))
