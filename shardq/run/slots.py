"""Execution slots: a node runs up to ``concurrency`` entities' jobs at once, each
entity's in one slot at a time (:mod:`shardq.run.chain`); what a lane may start there
(another batch; an entity's jobs in its own thread, inline). See docs/design/run.md.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from shardq.broker.base import Message
from shardq.core.lease import hand_back
from shardq.core.outcome import DONE, GAVE_UP, HIDDEN, LATER, STOPPED, EntityEnd
from shardq.run.chain import DEFERRED, GONE, PARKED, READY, RUNNING, Chain, Key, join, settle_again
from shardq.run.executor import Executor
from shardq.run.threads import Threads
from shardq.run.timing import Timing, may_take, run_inline, timing_after
from shardq.run.waits import Deadline, wait_until

if TYPE_CHECKING:
    from shardq.run.shard import Shard

log = structlog.get_logger("shardq.node")


class Slots:
    """The node's execution slots and entity chains. Thread-safe."""

    def __init__(
        self,
        concurrency: int,
        executor: Executor,
        stopping: threading.Event,
        threads: Threads,
        handover_wait: float = 30.0,
    ) -> None:
        self.concurrency = concurrency
        self.handover_wait = handover_wait  # how long a handover waits for running chains
        self._executor = executor
        self._stopping = stopping
        self._threads = threads
        self._clock = executor.clock  # one clock for the dues it sets and their turns
        self._lock = threading.Lock()  # taken directly where nothing waits on _cond
        self._cond = threading.Condition(self._lock)
        self._chains: dict[Key, Chain] = {}
        self._ready: deque[Chain] = deque()
        self._deferred: list[tuple[float, int, Chain]] = []
        self._seq = 0
        self._busy = 0
        self._idle_threads = 0
        self._started = 0  # slot threads started
        self._asked_threads = 0  # slot threads asked for, not started yet
        self._starting = 0  # slot threads being started
        # by equality: a lane's or poller's bound method is one waker however often given
        self._wakers: set[Callable[[], None]] = set()
        # by shard: its handover's ``done`` (None once called) and when it stops waiting
        self._sweeps: dict[int, tuple[Shard, Callable[[], None] | None, float]] = {}
        self._overdue_at = math.inf  # the first of their waits to end (or sooner)
        self._closed = False
        self._timings: dict[str, Timing] = {}
        self._here: dict[int, list[list[Message]]] = {}  # by thread: run in a lane now
        self.peak = 0  # most slots in use at once

    # -- what lanes call ---------------------------------------------------------------
    def hand(self, shard: Shard, groups: list[list[Message]]) -> None:
        """Each entity's jobs of a batch to a slot, after any it has here already; or,
        when :func:`run_inline` says so, those without a chain run here, in one slot."""
        timing, queue, chains = self._timings.get(shard.ref.worker), shard.queue, self._chains
        here: list[list[Message]] = []
        if run_inline(timing, 0, self.concurrency):  # no lock: only this lane makes its chains
            here = [ms for ms in groups if (queue, ms[0].group_id) not in chains]
        with self._lock:
            if here and run_inline(timing, self._busy, self.concurrency):
                self._took()
                self._here[threading.get_ident()] = here  # for running()
            else:
                here = []
            for messages in [ms for ms in groups if not any(ms is h for h in here)]:
                self._submit(shard, messages)
        self._start_threads()
        if here:
            self._run_here(shard, here)

    def room(self, wake: Callable[[], None]) -> bool:
        """May a lane start another batch (:func:`may_take`)? If not, ``wake`` is
        called once there is room."""
        if not self._ready and may_take(0, self.concurrency):
            return True  # nothing waits for a slot: no lock (lanes ask before each batch)
        with self._cond:
            if may_take(self._waiting(), self.concurrency):
                return True
            self._wakers.add(wake)
            return False

    def sweep(self, shard: Shard, unstarted: list[Message], done: Callable[[], None]) -> None:
        """A handover: the shard's chains not running and its other jobs not started
        (``unstarted``: the lane's) are handed back (:meth:`_hand_back`); ``done`` is
        called once its running chains finished and were handed back too, or once they
        ran ``handover_wait`` more (:meth:`overdue`)."""
        with self._cond:
            loose: list[Message] = []
            for m in unstarted:  # each joins its entity's chain here, if any
                chain = self._chains.get((shard.queue, m.group_id))
                (loose if chain is None else chain.pending).append(m)
            chains = [c for c in self._chains.values() if c.shard is shard]
            self._hand_back([c for c in chains if c.state != RUNNING], loose)
            if any(c.state == RUNNING for c in chains):
                self._sweeps[id(shard)] = (shard, done, self._clock() + self.handover_wait)
                self._overdue_at = min(self._overdue_at, self._sweeps[id(shard)][2])
                return
        done()

    def overdue(self) -> None:
        """Asked by the lanes between batches: a handover whose running chains ran
        ``handover_wait`` is done without them. Each keeps its own entity (its jobs stay
        held and extended here, so the broker hands none of the entity's jobs to anyone)
        until its run ends and hands back what is left (:meth:`_after`)."""
        if self._clock() < self._overdue_at:  # no lock: asked often
            return
        with self._lock:
            now, late = self._clock(), []
            for key, (shard, done, until) in list(self._sweeps.items()):
                if done is not None and until <= now:
                    self._sweeps[key] = (shard, None, math.inf)
                    running = [c for c in self._chains.values() if c.shard is shard]
                    entities = sorted(c.key[1] for c in running if c.state == RUNNING)
                    late.append((shard, done, entities))
            self._overdue_at = min((s[2] for s in self._sweeps.values()), default=math.inf)
        for shard, done, entities in late:
            log.warning(
                "node.handover_running",
                shard=str(shard.ref),
                entities=entities[:20],  # the first 20
                detail="their jobs still run: each keeps its own entity, held here until "
                "it ends; the shard's other entities are handed over",
            )
            done()

    def _run(self, chain: Chain) -> None:
        """Run a chain in this slot; one that a job joined meanwhile waits for a slot again."""
        shard, end = chain.shard, None
        try:
            end = self._executor.run_entity(shard.ref, chain.running, stop=self._stop(shard))
        except BaseException as exc:
            self._threads.fail(f"a run of jobs of {shard.ref}", exc)
        finally:
            with self._lock:
                if end is None:  # not run: the node is failing
                    end = EntityEnd(STOPPED, chain.running)
                elif end.kind == DONE:
                    self._timed(shard, end.performed, len(chain.running))
                end = self._settle_again(chain, end)
                chain.running = []
                if self._after(chain, end):  # a job joined it meanwhile
                    chain.state = READY
                    self._queue(chain)
                self._free(shard)
            self._start_threads()

    def _run_here(self, shard: Shard, groups: list[list[Message]]) -> None:
        """Run entities without a chain here, in one slot; one whose run did not end (a
        local retry, a stop) gets a chain."""
        ends: list[EntityEnd] = []
        try:
            for end in self._executor.run_entities(shard.ref, groups, self._stop(shard)):
                ends.append(end)
        except BaseException as exc:
            self._threads.fail(f"a run of jobs of {shard.ref}", exc)
        finally:
            with self._lock:
                del self._here[threading.get_ident()]
                for end in ends:
                    if end.kind == LATER or end.kind == STOPPED:
                        self._held(shard, end)
                for messages in groups[len(ends) :]:  # not run: the node is failing
                    self._held(shard, EntityEnd(STOPPED, messages))
                if len(ends) == len(groups) and all(end.kind == DONE for end in ends):
                    performed = sum(end.performed for end in ends)
                    self._timed(shard, performed, sum(len(ms) for ms in groups))
                self._free(shard)
            self._start_threads()

    def _timed(self, shard: Shard, seconds: float, jobs: int) -> None:
        """Its worker's ``jobs`` took ``seconds`` in all (for :func:`run_inline`)."""
        worker = shard.ref.worker
        self._timings[worker] = timing_after(self._timings.get(worker), seconds / jobs, jobs)

    def _held(self, shard: Shard, end: EntityEnd) -> None:
        """Jobs run here held for a local retry or a stop: they get a chain."""
        key = (shard.queue, end.messages[0].group_id)
        self._after(self._chains.setdefault(key, Chain(key, shard, [], RUNNING)), end)

    def _stop(self, shard: Shard) -> Callable[[], bool]:
        """Asked before each ``perform``: stop when the node stops or drops the shard."""
        return lambda: self._stopping.is_set() or shard.dropped

    # -- what the node reads -------------------------------------------------------------
    def in_use(self) -> int:
        return self._busy

    def idle(self) -> bool:
        with self._cond:
            return not self._chains and not self._here

    def close(self) -> None:
        """No chain starts any more (the node is stopping); running ones end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` (:mod:`shardq.run.waits`) for the running chains; True
        if none runs."""
        with self._cond:
            return wait_until(self._cond, lambda: not self._busy, Deadline(self._clock, timeout))

    def running(self) -> list[Message]:
        """Messages of the chains still running: their jobs and the later ones held."""
        with self._cond:
            here = [m for groups in self._here.values() for ms in groups for m in ms]
            return here + [
                m
                for c in self._chains.values()
                if c.state == RUNNING
                for m in [*c.running, *c.again.values(), *c.pending]
            ]

    def retries(self) -> list[tuple[float, list[Message]]]:
        """``(due, messages)`` of each chain held for a local retry."""
        with self._cond:
            return [(c.due, list(c.pending)) for c in self._chains.values() if c.state == DEFERRED]

    # -- inside (the lock held) --------------------------------------------------------
    def _submit(self, shard: Shard, messages: list[Message]) -> None:
        key = (shard.queue, messages[0].group_id)
        chain = self._chains.get(key)
        if chain is not None:
            stale = join(chain, messages)
            if stale:
                self._executor.give_up_later(stale)
            return
        self._queue(self._chains.setdefault(key, Chain(key, shard, list(messages), READY)))

    def _queue(self, chain: Chain) -> None:
        """A chain waits for a slot."""
        self._ready.append(chain)
        # a thread per chain waiting (a woken thread may still count as idle)
        if len(self._ready) > self._idle_threads and self._thread_count() < self.concurrency:
            self._asked_threads += 1  # started once the lock is released
        self._cond.notify()

    def _settle_again(self, chain: Chain, end: EntityEnd) -> EntityEnd:
        end, ended, stale = settle_again(chain, end)
        if ended:
            self._executor.delete(ended)
        if stale:
            self._executor.give_up_later(stale)
        return end

    def _waiting(self) -> int:
        return sum(len(c.pending) for c in self._ready if c.state == READY)

    def _free(self, shard: Shard) -> None:
        """A run ended: its slot is free."""
        self._busy -= 1
        self._wake_lanes()
        self._end_sweep(shard)
        if self._ready:  # a slot is free for a chain waiting
            self._cond.notify()

    def _took(self) -> None:
        self._busy += 1
        self.peak = max(self.peak, self._busy)

    def _wake_lanes(self) -> None:
        if self._wakers and may_take(self._waiting(), self.concurrency):
            wakers, self._wakers = self._wakers, set()
            for wake in wakers:
                wake()

    def _after(self, chain: Chain, end: EntityEnd) -> bool:
        """Settle a run's end; True if the chain runs on in this slot."""
        if end.kind == HIDDEN:
            if chain.pending:
                self._executor.hide_later(chain.pending, max(0.0, end.due - self._clock()))
            return self._remove(chain)
        if end.kind == GAVE_UP:
            if chain.pending:
                self._executor.give_up_later(chain.pending)
            return self._remove(chain)
        if end.kind in (LATER, STOPPED):
            chain.pending = [*end.messages, *chain.pending]
        if end.kind == LATER:
            chain.state, chain.due = DEFERRED, end.due
            self._seq += 1
            heapq.heappush(self._deferred, (end.due, self._seq, chain))
            if self._idle_threads == 0 and self._thread_count() < self.concurrency:
                self._asked_threads += 1  # a slot thread runs it when due
            self._cond.notify()  # a waiting thread looks at the new due time
        elif not chain.pending:  # DONE, nothing joined
            return self._remove(chain)
        elif end.kind == DONE and not (self._stopping.is_set() or chain.shard.dropped):
            return True
        else:
            chain.state = PARKED
        if id(chain.shard) in self._sweeps:
            self._hand_back([chain])
        return False

    def _remove(self, chain: Chain) -> bool:
        chain.state = GONE
        self._chains.pop(chain.key, None)
        return False

    def _hand_back(self, chains: list[Chain], loose: Sequence[Message] = ()) -> None:
        """Hand chains not running and ``loose`` jobs back (a handover) in the order
        :func:`~shardq.core.lease.hand_back` gives."""
        retries = [(c.due, c.pending) for c in chains if c.state == DEFERRED]
        unstarted = [m for c in chains if c.state != DEFERRED for m in c.pending]
        for chain in chains:
            self._remove(chain)
        plan = hand_back([*unstarted, *loose], retries=retries, now=self._clock())
        for messages, seconds in plan:
            self._executor.hide(messages, seconds)

    def _end_sweep(self, shard: Shard) -> None:
        sweep = self._sweeps.get(id(shard))
        if sweep is None:
            return
        if not any(c.shard is shard and c.state == RUNNING for c in self._chains.values()):
            del self._sweeps[id(shard)]
            if sweep[1] is not None:
                sweep[1]()

    # -- the slot threads --------------------------------------------------------------
    def _thread_count(self) -> int:
        """Slot threads started, being started or asked for (the lock held)."""
        return self._started + self._asked_threads + self._starting

    def _start_threads(self) -> None:
        """Start the slot threads asked for (the lock not held)."""
        while self._asked_threads:  # read without the lock: a later ask is started later
            with self._lock:
                if not self._asked_threads or self._closed:
                    return
                self._asked_threads -= 1
                self._starting += 1
                name = f"shardq-slot-{self._started + self._starting - 1}"
            started = False
            try:
                self._threads.start(name, "an execution slot", self._slot)
                started = True
            finally:
                with self._lock:
                    self._starting -= 1
                    self._started += started

    def _slot(self) -> None:
        while True:
            with self._cond:
                chain = self._take()
            if chain is None:
                return
            self._run(chain)

    def _take(self) -> Chain | None:
        """The next chain to run (the lock held); None once closed."""
        while not self._closed:
            if not self._stopping.is_set():
                now = self._clock()
                while self._deferred and self._deferred[0][0] <= now:
                    due, _, chain = heapq.heappop(self._deferred)
                    if chain.state == DEFERRED and chain.due == due:
                        if chain.shard.dropped:  # its handover's sweep hands it back
                            continue
                        chain.state = READY
                        self._ready.append(chain)
                while self._ready and self._busy < self.concurrency:
                    chain = self._ready.popleft()
                    if chain.state != READY:
                        continue
                    if chain.shard.dropped:  # its handover's sweep releases it
                        chain.state = PARKED
                        continue
                    chain.state = RUNNING
                    chain.running, chain.pending = chain.pending, []
                    self._took()
                    self._wake_lanes()
                    return chain
            wait = self._deferred[0][0] - self._clock() if self._deferred else 1.0
            self._idle_threads += 1
            self._cond.wait(min(1.0, max(0.005, wait)))
            self._idle_threads -= 1
        return None
