"""A lane: one node thread serving its own shards, with up to ``prefetch`` receives in
flight; shards join and leave through its inbox. See docs/design/run.md.
"""

from __future__ import annotations

import queue
import random
import threading
from typing import TYPE_CHECKING

from shardq.broker.base import Message
from shardq.core.clock import Clock, wall
from shardq.core.errors import ConfigError
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.core.plan import Plan
from shardq.core.scheduler import Scheduler, ShardView
from shardq.run.shard import WAKE, Inbox, Join, Leave, Shard, Swept, by_entity
from shardq.run.threads import Threads

if TYPE_CHECKING:
    from shardq.run.idle import Pollers, Watcher
    from shardq.run.intake import Intake
    from shardq.run.slots import Slots


class Lane:
    """One node thread: hands its shards' batches to the slots, receives overlapped.
    ``wall_clock``: Unix time, compared with the broker's sent times to age shards' heads."""

    def __init__(
        self,
        intake: Intake,
        slots: Slots,
        watch: Pollers | Watcher,
        index: int,
        shards: list[Shard],
        rng: random.Random,
        *,
        prefetch: int,
        wall_clock: Clock = wall,
        threads: Threads | None = None,
    ) -> None:
        self.name = f"shardq-lane-{index}"
        self._threads = threads or Threads()
        self.thread: threading.Thread | None = None
        self.intake, self.slots, self.watch, self.prefetch = intake, slots, watch, prefetch
        self.wall, self.index, self.shards = wall_clock, index, shards
        self.inbox: Inbox = queue.SimpleQueue()
        self._scheduler = Scheduler(rng)
        self._picks = self._in_flight = 0
        self._in_hand = 0  # received batches not started, over all the lane's shards

    def start(self) -> None:
        self.thread = self._threads.start(self.name, f"lane {self.index}", self._serve)

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _serve(self) -> None:
        for s in self.shards:  # the idle watch finds out which shards have work
            self.watch.watch(s, self.inbox)
        stopping, room = self.intake.stopping, self.slots.room
        while not stopping.is_set():
            can = bool(self._ready()) and room(self._wake)
            self._collect(0.0 if can else 0.5)
            self.slots.overdue()  # a handover waits for running jobs for so long
            if stopping.is_set():
                return
            self._prefetch()
            ready = self._ready()
            if not can and not (ready and room(self._wake)):
                continue
            shard = self.pick(ready)
            if shard is None:
                continue
            batch = shard.batches.popleft()
            self._in_hand -= 1
            shard.head_sent_at = shard.batches[0][0].sent_at if shard.batches else None
            self._prefetch()
            self.slots.hand(shard, by_entity(batch))  # each entity to a slot, or run here
            self._settle_idle(shard)

    def _ready(self) -> list[Shard]:
        return [s for s in self.shards if s.batches and not s.dropped]

    def _wake(self) -> None:
        self.inbox.put(WAKE)

    # -- which shards ----------------------------------------------------------------
    def set_shards(self, shards: list[Shard]) -> None:
        """Replace the list, never changed in place (by the lane's thread, or by anyone
        before it starts)."""
        self.shards = shards

    def _leave(self, leave: Leave) -> None:
        """Serve a shard no more: the slots hand its jobs back (:meth:`Slots.sweep`);
        receives still in flight are released when they return, before ``swept``."""
        shard = leave.shard
        self.set_shards([s for s in self.shards if s is not shard])
        self.watch.unwatch(shard)
        unstarted = [m for batch in shard.batches for m in batch]
        self._in_hand -= len(shard.batches)
        shard.batches.clear()
        shard.leave, shard.sweeping = leave, True
        self.slots.sweep(shard, unstarted, lambda: self.inbox.put(Swept(shard)))

    @staticmethod
    def _swept(shard: Shard) -> None:
        if shard.leave is not None and not shard.fetching and not shard.sweeping:
            shard.leave.swept()
            shard.leave = None

    def idle(self) -> bool:
        return (
            self._in_flight == 0
            and self.inbox.empty()
            and all(s.watched and not s.batches for s in self.shards)
        )

    # -- receiving ------------------------------------------------------------------
    def _prefetch(self) -> None:
        """Up to ``prefetch`` receives in flight, at most ``prefetch`` + 1 batches in hand."""
        limit = self.prefetch
        while self._in_flight < limit and self._in_flight + self._in_hand <= limit:
            candidates = [
                s
                for s in self.shards
                if s.more and s.fetching < limit and len(s.batches) < 2 and not s.dropped
            ]
            shard = self.pick(candidates)
            if shard is None:
                return
            shard.fetching += 1
            self._in_flight += 1
            self.intake.pool.submit(self._fetch, shard)

    def _fetch(self, shard: Shard) -> None:
        """In a pool thread: one receive without waiting, handed back to the lane."""
        messages: list[Message] | None = None
        try:
            messages = self.intake.receive(shard, wait_seconds=self.intake.broker.prefetch_wait)
            if self.intake.stopping.is_set() or shard.dropped:  # it may have been swept
                self.intake.release_straggler(messages)
                messages = None
        except BaseException as exc:
            self.intake.fail(f"a receive for {shard.ref}", exc)
        finally:
            found = messages or []
            self.inbox.put((shard, found, len(found) == MAX_BATCH_ENTRIES))

    def _collect(self, timeout: float) -> None:
        """Take what reached the inbox; wait up to ``timeout`` for the first (0: do not)."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout > 0 else self.inbox.get_nowait()
            while True:
                match item:  # WAKE (there is room again) needs nothing
                    case Swept(shard):
                        shard.sweeping = False
                        self._swept(shard)
                    case Join(shard):
                        self.set_shards([*self.shards, shard])
                        if not shard.dropped:
                            self.watch.watch(shard, self.inbox)
                    case Leave():
                        self._leave(item)
                    case (shard, messages, full):
                        self._found(shard, messages, full)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _found(self, shard: Shard, messages: list[Message] | None, full: bool) -> None:
        if messages is None:  # the embedded watcher: it may have work
            shard.watched, shard.more = False, not shard.dropped
            return
        if shard.fetching:  # our own receive (a poller's is not counted)
            shard.fetching -= 1
            self._in_flight -= 1
        else:
            shard.watched = False
        if shard.dropped:  # received while (or just before) the shard was dropped
            self.intake.release_straggler(messages)
            self._swept(shard)
            return
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
        if idle and not shard.dropped and not self.intake.stopping.is_set():
            self.watch.watch(shard, self.inbox)

    # -- choosing -------------------------------------------------------------------
    def pick(self, shards: list[Shard]) -> Shard | None:
        """The shard of ``shards`` to serve (or receive for) next (the lane's thread)."""
        picked = self._scheduler.pick(shard_views(shards, self.wall()))
        if picked is None:
            return None
        self._picks += 1
        picked.key.last_served = self._picks
        return picked.key


def shard_views(shards: list[Shard], now: float) -> list[ShardView[Shard]]:
    """What the scheduler sees of ``shards`` at Unix time ``now``: each one's lag is the
    age of the oldest job believed waiting in it (0 when none is known)."""
    return [
        ShardView(
            s,
            s.ref.priority,
            now - s.head_sent_at if s.head_sent_at else 0.0,
            ready=True,
            last_served=s.last_served,
        )
        for s in shards
    ]


def lane_count(plan: Plan, threads: int | None) -> int:
    """How many lanes a node runs: ``threads``, at least one per thread of its plan."""
    least = max(1, len(plan.threads))
    if threads is not None and threads < least:
        raise ConfigError(
            f"threads={threads}: a node needs at least one lane, and one per thread of its "
            f"plan ({len(plan.threads)}); pass more threads, or None for the plan's"
        )
    return least if threads is None else threads
