"""A node: the shards of its plan, one lane (thread) per plan slot, run until stopped;
its own thread logs progress, does housekeeping and notices when it is drained
(:meth:`Node._watch`). See docs/design/run.md.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import structlog

from shardq.core.clock import Clock, monotonic, wall
from shardq.core.errors import BrokerError
from shardq.core.exits import EXIT_ERROR, EXIT_GRACE_EXPIRED, EXIT_OK
from shardq.core.lease import HELD, hand_back
from shardq.core.middleware import notify
from shardq.core.outcome import Observer, Tally
from shardq.core.plan import Plan, ShardRef, format_plan
from shardq.core.signals import StopSignals
from shardq.core.topology import parse_name
from shardq.run.executor import Executor
from shardq.run.idle import EmptyCheck, Pollers, Watcher
from shardq.run.intake import Intake, OldJobs
from shardq.run.lane import Lane, lane_count
from shardq.run.leases import Leases, extend_interval
from shardq.run.metrics import NodeMetrics
from shardq.run.ownership import Ownership
from shardq.run.parts import Keeper, Membership, make_node_id
from shardq.run.shard import Shard
from shardq.run.slots import Slots
from shardq.run.threads import Threads, describe
from shardq.run.timelimit import TimeLimits
from shardq.run.waits import Deadline

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.node")

#: Seconds between calls of the broker's housekeeping (``Broker.maintain``).
MAINTAIN_EVERY_SECONDS = 30.0
#: Longest wait for pending deletes and releases at shutdown.
FLUSH_SECONDS = 5.0
#: Longest wait for a receive in flight on a queue where jobs were released at shutdown.
STRAGGLER_SECONDS = 1.0
#: Longest wait for the node's threads to end (those not in a long poll or a job end at once).
THREADS_SECONDS = 0.2


class Node:
    """Runs the plan of one node. :meth:`run` blocks until the node stops.

    ``threads``: how many lanes (an elastic node: more than its plan's; None: the plan's).
    ``clock``: monotonic seconds; ``wall_clock``: Unix time, compared with others' stamps.
    """

    watch_seconds = 0.25  # between two looks of the node's own loop (_watch)

    def __init__(
        self,
        app: Deployment,
        plan: Plan,
        *,
        keeper: Callable[[Node], Keeper],
        fleet: Callable[[Node], Membership] | None = None,
        threads: int | None = None,
        until_empty: bool = False,
        seed: int | None = None,
        observers: Sequence[Observer] = (),
        concurrency: int | None = None,
        clock: Clock = monotonic,
        wall_clock: Clock = wall,
    ) -> None:
        self.app, self.plan, self.clock, self.wall = app, plan, clock, wall_clock
        self.config = app.config
        self.until_empty = until_empty
        self.elastic = threads is not None
        self.failed = False  # fail() sets it, from any thread
        self.threads = Threads(self.fail)
        threads = lane_count(plan, threads)
        # Requests to SQS overlap; a local broker (one that can watch queues) runs one at a time.
        local = app.broker.watch([], 0) is not None
        self.pool = ThreadPoolExecutor(2 if local else threads * self.config.prefetch, "shardq-io")
        self.lease_pool = ThreadPoolExecutor(2 if local else 2 * threads + 2, "shardq-settle")
        # leases of the plan's workers (an elastic node: of any, whose shards it may be given)
        workers = app.workers if self.elastic else {ref.worker for ref in plan.shards}
        self.leases = Leases(
            app.broker,
            self.lease_pool,
            interval=extend_interval(app.settings(w).visibility_timeout for w in workers),
            on_broker_error=self._broker_error,
            clock=clock,
            wall_clock=wall_clock,
            threads=self.threads,
        )
        self.old_jobs = OldJobs(app.broker, self.config.retention_warning_share, wall_clock)
        self.intake = Intake(
            app.broker,
            self.leases,
            self.old_jobs,
            self.pool,
            fail=self.fail,
            broker_error=self._broker_error,
            clock=clock,
            one_file=local,
        )
        self.stopping = self.intake.stopping
        self.limits = TimeLimits(clock, self.threads)
        self.id = make_node_id()
        self.fleet = fleet(self) if fleet is not None else None
        self.id = self.fleet.id if self.fleet is not None else self.id
        self.metrics = NodeMetrics(
            self.lags,
            self.leases.count,
            node=self.id,
            slots=lambda: (self.slots.in_use(), self.slots.concurrency),
            progress_seconds=self.config.progress_seconds,
            clock=clock,
        )
        self.executor = Executor(
            app,
            self.leases,
            self.limits,
            self.stopping,
            [self.metrics, *observers],
            router=lambda ref, entity: self.layout.route(ref, entity),
            clock=clock,
            wall_clock=wall_clock,
        )
        concurrency = self.config.concurrency if concurrency is None else concurrency
        self.slots = Slots(
            concurrency, self.executor, self.stopping, self.threads, self.config.grace_seconds
        )
        self.metrics_port: int | None = None
        wait = self.config.idle_wait_seconds
        self.idle: Pollers | Watcher = (
            Watcher(self.intake, self.threads)
            if local
            else Pollers(self.intake, wait, self.threads)
        )
        rng = random.Random(seed)
        refs = [*plan.threads, *[()] * (threads - len(plan.threads))]
        self.lanes = [
            Lane(
                self.intake,
                self.slots,
                self.idle,
                i,
                [self.make_shard(ref) for ref in mine],
                random.Random(rng.random()),
                prefetch=self.config.prefetch,
                wall_clock=wall_clock,
                threads=self.threads,
            )
            for i, mine in enumerate(refs)
        ]
        self.ownership = Ownership(app, self.intake, self.lanes, self.make_shard, self.threads)
        self.layout = keeper(self)
        self.signals = StopSignals(self.stopping)
        self.empty = EmptyCheck(app.broker, self._queues, self.broker_trouble, clock)

    def make_shard(self, ref: ShardRef) -> Shard:
        settings = self.app.settings(ref.worker)
        queue = self.app.shard_queue(ref.worker, ref.shard, ref.gen)
        return Shard(ref, queue, settings.visibility_timeout)

    # -- the shards it serves (any thread) ------------------------------------------------
    def add_shard(self, ref: ShardRef) -> None:
        """Serve ``ref`` too (:meth:`Ownership.add`)."""
        self.ownership.add(ref)

    def drop_shard(self, ref: ShardRef) -> threading.Event:
        """Serve ``ref`` no more (:meth:`Ownership.drop`)."""
        return self.ownership.drop(ref)

    def shard_refs(self) -> list[ShardRef]:
        """The shards served now."""
        return self.ownership.refs()

    # -- running ---------------------------------------------------------------
    def run(self, signals_before: Callable[[], int] | None = None) -> int:
        """Run until stopped (or drained with ``until_empty``); returns the exit code.
        ``signals_before``: how many stop signals came before the node's handlers."""
        self.signals.install(signals_before() if signals_before else 0)
        try:
            return self._run()
        finally:
            self.signals.restore()  # a program that embeds the node gets its handlers back

    def _run(self) -> int:
        if self.signals.count:
            self.stop()
        try:
            self._start()  # a broker or config error here ends the run (the CLI says why)
        except BaseException:
            self.stop()
            self.metrics.close()
            self.ownership.finish()
            raise
        try:
            self._watch()
        except Exception as exc:  # a bug here must still stop the lanes and release jobs
            self.fail("the node's own thread", exc)
        return self._shut_down()

    def _watch(self) -> None:
        """The node's own loop: progress, housekeeping, until-empty (a part that fails
        stops the node by itself: :mod:`shardq.run.threads`)."""
        quiet, next_maintain = 0, self.clock() + MAINTAIN_EVERY_SECONDS
        while not self.stopping.wait(self.watch_seconds):
            self.metrics.log_progress()
            if (now := self.clock()) >= next_maintain:
                next_maintain = now + MAINTAIN_EVERY_SECONDS
                try:
                    self.app.broker.maintain()
                except BrokerError as exc:
                    self.broker_trouble("maintain", None, exc)
            quiet = quiet + 1 if self.until_empty and self._idle() else 0
            if quiet >= 2:  # asks the broker once idle a while
                quiet = 0
                if self.empty.drained():
                    log.info("node.drained", detail="every shard is empty; stopping")
                    self.stop()

    def _start(self) -> None:
        self.app.layouts.refresh()  # before any shard is taken (a shardq reshard moved them?)
        log.info(
            "node.starting",
            node=self.plan.node,
            nodes=self.plan.nodes,
            threads=len(self.lanes),
            shards=len(self.plan.shards),
            broker=self.app.broker.kind,
        )
        if self.elastic and not self.plan.shards:  # its shards come later
            log.info("node.elastic", threads=len(self.lanes), detail="shards are added later")
        else:
            for line in format_plan([self.plan]).splitlines():
                log.info("node.plan", line=line)
        if not self.plan.shards and not self.elastic:
            log.warning(
                "node.no_shards",
                node=self.plan.node,
                nodes=self.plan.nodes,
                detail="this node owns no shard: there are more nodes than shards; it "
                "will idle. Run fewer nodes or give the workers more shards.",
            )
        for ref in self.plan.shards:
            if self.stopping.is_set():
                return
            self.app.ensure_queue(self.app.shard_queue(ref.worker, ref.shard, ref.gen), ref.worker)
        if self.stopping.is_set():
            return
        if (port := self.config.metrics_port) is not None:
            host = self.config.metrics_host
            self.metrics_port = self.metrics.serve(port, host, self.threads)
            log.info("node.metrics", url=f"http://{host}:{self.metrics_port}/metrics")
        self.idle.start()
        notify(self.app.middleware, "on_node_start", self)
        self.leases.start()
        self.ownership.start()
        if self.fleet is not None and not self.stopping.is_set():
            self.fleet.join()
        self.layout.start()

    def _shut_down(self) -> int:
        """Graceful stop (first SIGTERM/SIGINT/SIGHUP, or :meth:`stop`; a second signal
        exits at once) of every part of the node; returns its exit code."""
        if self.signals.name:
            log.info(
                "node.signal",
                signal=self.signals.name,
                detail="finishing running jobs; send it again to exit at once",
            )
        self.app.broker.wake_waiters()
        log.info("node.stopping", grace_seconds=self.config.grace_seconds)
        grace = Deadline(self.clock, self.config.grace_seconds)
        for lane in self.lanes:
            lane.join(grace.left())
        self.slots.close()
        self.slots.join(grace.left())
        self.executor.perform.loop.close()
        # receives in flight are not waited for: what they bring is released (Lane._fetch)
        self.pool.shutdown(wait=False, cancel_futures=True)
        # A job still running keeps its entity's later jobs (they reappear after it).
        still = self.slots.running()
        running = {m.receipt for m in still}
        held = self.leases.held(HELD)
        for messages, seconds in hand_back(held, running, self.slots.retries(), self.clock()):
            self.leases.hide(messages, seconds)
        flushed = self.leases.close(FLUSH_SECONDS)
        released = [m for m in held if m.receipt not in running]
        # a long poll in flight may take what was just released: let it hand that back
        self.intake.quiet({m.queue for m in released}, STRAGGLER_SECONDS)
        if self.fleet is not None:
            self.fleet.leave()  # after every job message is settled: hand the shards back
        self.lease_pool.shutdown(wait=False)
        self.limits.close()
        self.metrics.close()
        notify(self.app.middleware, "on_node_stop", self)
        self.ownership.finish()
        self.idle.wake()
        left = self.threads.left(THREADS_SECONDS)
        if left:
            log.info(
                "node.threads_left",
                threads=left,
                detail="still in a receive (a long poll cannot be cut short), a job, a "
                "store call or a handover; what a receive brings is released while the process "
                "lives, and reappears after its visibility timeout if the process exits first",
            )
        tally = self.tally()
        log.info(
            "node.stopped",
            succeeded=sum(tally.succeeded.values()),
            retried=sum(tally.retried.values()),
            morgued=sum(tally.morgued.values()),
            released=len(released),
            abandoned_running=len(running),
        )
        if not flushed:
            log.warning(
                "node.unsettled",
                messages=self.leases.count(),
                detail="the broker did not confirm every delete or release in time; those "
                "jobs reappear after their visibility timeout",
            )
        if running:
            log.warning(
                "node.grace_expired",
                running_jobs=len(running),
                entities=sorted({m.group_id for m in still})[:20],  # the first 20
                detail="their messages reappear after their visibility timeout",
            )
            return EXIT_GRACE_EXPIRED
        return EXIT_ERROR if self.failed else EXIT_OK

    def stop(self) -> None:
        """Begin a graceful shutdown (idempotent, callable from any thread)."""
        self.intake.stop()

    def fail(self, what: str, exc: BaseException) -> None:
        """A part of the node died for an unexpected reason: stop with exit code 1."""
        self.failed = True
        self.stop()  # first: whatever the log call meets, the node stops
        log.error(
            "node.part_failed",
            part=what,
            error=describe(exc),
            exc_info=exc,
            detail="stopping the node; its jobs are released or reappear",
        )

    def broker_trouble(self, operation: str, queue: str | None, exc: BaseException) -> None:
        self.intake.broker_trouble(operation, queue, exc)

    def tally(self) -> Tally:
        return self.metrics.tally.copy()

    def _broker_error(self, operation: str) -> None:
        self.metrics.broker_error(operation)

    def lags(self) -> list[tuple[str, int, float]]:
        """``(worker, shard, seconds)`` (worker as ``Orders@2`` past generation 0): the age
        of the oldest job believed waiting in each served shard (0 when none is known)."""
        now = self.wall()
        return [
            (
                s.ref.name,
                s.ref.shard,
                # read once: its lane may empty the shard meanwhile
                0.0 if s.watched or (sent := s.head_sent_at) is None else max(0.0, now - sent),
            )
            for lane in self.lanes
            for s in lane.shards
        ]

    # -- the node's own thread ---------------------------------------------------------
    def _idle(self) -> bool:
        lanes_idle = all(lane.idle() for lane in self.lanes)
        return lanes_idle and not self.leases.count() and self.slots.idle()

    def _queues(self) -> list[str]:
        """The queues an until-empty node waits to see empty."""
        if self.fleet is not None and self.fleet.elastic:  # every shard, held or not
            return [
                self.app.shard_queue(worker, n, parse_name(name)[1])
                for worker in self.app.workers
                for name, count in self.app.live_shards(worker).items()
                for n in range(count)
            ]
        return [shard.queue for lane in self.lanes for shard in lane.shards]
