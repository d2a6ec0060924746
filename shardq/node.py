"""A node: the shards of its plan, one lane (thread) per plan slot, run until stopped.

Each **lane** owns its shards alone. In a loop it asks its scheduler for the next
shard with work, takes that shard's waiting batch (or receives one, up to 10
messages, without waiting) and runs it. A shard whose receive returned fewer than
10 messages may be empty: it goes to its **poller**, a thread that long-polls that
one queue (up to ``idle_wait_seconds``, 20 s on SQS) and hands whatever arrives
back to the lane. So a job published to any idle shard starts about as soon as the
broker returns it, and an idle shard costs one request per long poll (180 per hour
on SQS), never a busy loop.

Shutdown (first SIGTERM/SIGINT, or :meth:`Node.stop`): no new batches start; the
running ``perform`` calls finish within ``grace_seconds``; every message received
but not started is released (visible again at once); the process exits 0. A second
signal exits at once. A message whose job is still running is never released: if
the grace period runs out it becomes visible when its visibility timeout ends.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from shardq.broker.base import Message, batches
from shardq.errors import BrokerError
from shardq.executor import Executor, Observer, Tally
from shardq.heartbeat import Heartbeat
from shardq.limits import MAX_BATCH_ENTRIES
from shardq.metrics import NodeMetrics
from shardq.middleware import notify
from shardq.plan import Plan, ShardRef, format_plan
from shardq.scheduler import Scheduler, ShardView

if TYPE_CHECKING:
    from shardq.app import App

log = structlog.get_logger("shardq.node")


@dataclass(eq=False)
class _Shard:
    """A shard as its lane sees it."""

    ref: ShardRef
    queue: str
    visibility_timeout: int
    waiting: list[Message] = field(default_factory=list)
    head_sent_at: float | None = None  # sent time of the oldest job believed waiting
    watched: bool = False
    last_served: int = 0


class Node:
    """Runs the plan of one node. :meth:`run` blocks until the node stops."""

    def __init__(
        self,
        app: App,
        plan: Plan,
        *,
        until_empty: bool = False,
        seed: int | None = None,
        observers: Sequence[Observer] = (),
    ) -> None:
        self.app = app
        self.plan = plan
        self.config = app.config
        self.until_empty = until_empty
        self.stopping = threading.Event()
        self.heartbeat = Heartbeat(app.broker, interval=_heartbeat_interval(app, plan))
        self.metrics = NodeMetrics(self._lags, self.heartbeat.held_count)
        self.observers: list[Observer] = [self.metrics, *observers]
        self.metrics_port: int | None = None
        rng = random.Random(seed)
        self.lanes = [
            Lane(self, i, [self._shard(ref) for ref in refs], random.Random(rng.random()))
            for i, refs in enumerate(plan.threads)
        ]
        self.pollers: dict[int, Poller] = {}
        self._signals = 0

    def _shard(self, ref: ShardRef) -> _Shard:
        settings = self.app.settings(ref.worker)
        queue_name = self.app.shard_queue(ref.worker, ref.shard)
        return _Shard(ref, queue_name, settings.visibility_timeout)

    # -- running ---------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped (or drained with ``until_empty``); returns the exit code."""
        self._start()
        quiet = 0
        while not self.stopping.wait(0.25):
            if self.until_empty:
                quiet = quiet + 1 if self._drained() else 0
                if quiet >= 2:
                    log.info("node.drained", detail="every shard is empty; stopping")
                    self.stop()
        return self._shutdown()

    def _start(self) -> None:
        self._install_signal_handlers()
        self._ensure_queues()
        log.info(
            "node.starting",
            node=self.plan.node,
            nodes=self.plan.nodes,
            threads=len(self.lanes),
            shards=len(self.plan.shards),
            broker=self.app.broker.kind,
        )
        log.info("node.plan", plan=format_plan([self.plan]))
        if self.config.metrics_port is not None:
            self.metrics_port = self.metrics.serve(
                self.config.metrics_port, self.config.metrics_host
            )
            log.info(
                "node.metrics", url=f"http://{self.config.metrics_host}:{self.metrics_port}/metrics"
            )
        notify(self.app.middleware, "on_node_start", self)
        self.heartbeat.start()
        for lane in self.lanes:
            lane.start()

    def stop(self) -> None:
        """Begin a graceful shutdown (idempotent, callable from any thread)."""
        self.stopping.set()
        self.app.broker.wake_waiters()

    def watch(self, shard: _Shard, lane: Lane) -> None:
        """Hand an idle shard to its poller."""
        shard.watched = True
        poller = self.pollers.get(id(shard))
        if poller is None:
            poller = self.pollers[id(shard)] = Poller(self, shard, lane)
            poller.start()
        poller.wake.set()

    def tally(self) -> Tally:
        total = Tally()
        for lane in self.lanes:
            for kind in ("succeeded", "retried", "morgued"):
                for worker, n in getattr(lane.tally, kind).items():
                    total.add(kind, worker, n)
        return total

    def _lags(self) -> list[tuple[str, int, float]]:
        now = time.time()
        return [
            (
                s.ref.worker,
                s.ref.shard,
                0.0 if s.watched or s.head_sent_at is None else max(0.0, now - s.head_sent_at),
            )
            for lane in self.lanes
            for s in lane.shards
        ]

    # -- internals ---------------------------------------------------------------
    def _ensure_queues(self) -> None:
        for ref in self.plan.shards:
            self.app.ensure_queue(self.app.shard_queue(ref.worker, ref.shard), ref.worker)
        for worker in {ref.worker for ref in self.plan.shards}:
            self.app.ensure_queue(self.app.morgue_queue(worker), worker)

    def _drained(self) -> bool:
        if not all(lane.idle() for lane in self.lanes):
            return False
        broker = self.app.broker
        try:
            for lane in self.lanes:
                for shard in lane.shards:
                    counts = broker.counts(shard.queue)
                    if counts.waiting or counts.in_flight:
                        return False
        except BrokerError:
            return False
        return True

    def _shutdown(self) -> int:
        log.info("node.stopping", grace_seconds=self.config.grace_seconds)
        deadline = time.monotonic() + self.config.grace_seconds
        for lane in self.lanes:
            lane.join(max(0.0, deadline - time.monotonic()))
        stuck = [lane for lane in self.lanes if lane.is_alive()]
        for poller in self.pollers.values():
            poller.join(self.config.idle_wait_seconds + 5)
        running = {m.receipt for lane in stuck for m in lane.current}
        release(
            self.app, self.heartbeat, [m for m in self.heartbeat.held() if m.receipt not in running]
        )
        self.heartbeat.stop()
        self.metrics.close()
        notify(self.app.middleware, "on_node_stop", self)
        tally = self.tally()
        log.info(
            "node.stopped",
            succeeded=sum(tally.succeeded.values()),
            retried=sum(tally.retried.values()),
            morgued=sum(tally.morgued.values()),
            abandoned_running=len(running),
        )
        if stuck:
            log.warning(
                "node.grace_expired",
                running_jobs=len(running),
                detail="their messages reappear after their visibility timeout",
            )
            return 3
        return 1 if any(lane.failed for lane in self.lanes) else 0

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("node.forced_exit", signal=signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info(
            "node.signal",
            signal=signal.Signals(signum).name,
            detail="finishing running jobs; send it again to exit at once",
        )
        self.stop()


class Lane(threading.Thread):
    """One node thread: serves its own shards, one batch at a time."""

    def __init__(self, node: Node, index: int, shards: list[_Shard], rng: random.Random) -> None:
        super().__init__(name=f"shardq-lane-{index}", daemon=True)
        self.node = node
        self.shards = shards
        self.inbox: queue.SimpleQueue[tuple[_Shard, list[Message]]] = queue.SimpleQueue()
        self.tally = Tally()
        self.current: list[Message] = []
        self.failed = False
        self._scheduler = Scheduler(rng)
        self._executor = Executor(
            node.app, node.heartbeat, node.stopping, [self.tally, *node.observers]
        )
        self._picks = 0

    def run(self) -> None:
        try:
            self._serve()
        except Exception:
            self.failed = True
            log.exception(
                "node.lane_failed",
                lane=self.name,
                detail="stopping the node; its jobs are released or reappear",
            )
            self.node.stop()

    def _serve(self) -> None:
        for shard in self.shards:  # pollers find out which shards have work
            self.node.watch(shard, self)
        while not self.node.stopping.is_set():
            picked = self._next_shard()
            if picked is None:
                continue
            shard = picked
            self.current = shard.waiting or self._receive(shard)
            shard.waiting = []
            try:
                if self.current:
                    self._executor.run_batch(shard.ref, self.current)
            finally:
                got, self.current = len(self.current), []
            if got < MAX_BATCH_ENTRIES:
                self.node.watch(shard, self)

    def idle(self) -> bool:
        return (
            not self.current
            and self.inbox.empty()
            and all(s.watched and not s.waiting for s in self.shards)
        )

    def _next_shard(self) -> _Shard | None:
        self._collect(block=False)
        now = time.time()
        views = [
            ShardView(
                s,
                s.ref.priority,
                now - s.head_sent_at if s.head_sent_at else 0.0,
                ready=not s.watched,
                last_served=s.last_served,
            )
            for s in self.shards
        ]
        picked = self._scheduler.pick(views)
        if picked is None:
            self._collect(block=True)
            return None
        self._picks += 1
        picked.key.last_served = self._picks
        return picked.key

    def _collect(self, block: bool) -> None:
        """Take the batches pollers found; wait up to 0.5 s for one if ``block``."""
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            shard, messages = item
            shard.waiting, shard.watched = messages, False
            shard.head_sent_at = messages[0].sent_at
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _receive(self, shard: _Shard) -> list[Message]:
        try:
            messages = self.node.app.broker.receive(
                shard.queue,
                max_messages=MAX_BATCH_ENTRIES,
                wait_seconds=0,
                visibility_timeout=shard.visibility_timeout,
            )
        except BrokerError as exc:
            log.warning("node.receive_failed", queue=shard.queue, error=str(exc))
            self.node.metrics.broker_error("receive")
            return []  # the shard goes to its poller, which backs off
        self.node.heartbeat.hold(messages, shard.visibility_timeout)
        if len(messages) == MAX_BATCH_ENTRIES:  # more wait behind: newer than the last one
            shard.head_sent_at = messages[-1].sent_at
        return messages


class Poller(threading.Thread):
    """Long-polls one idle shard and hands the messages that arrive to its lane."""

    def __init__(self, node: Node, shard: _Shard, lane: Lane) -> None:
        super().__init__(name=f"shardq-poll-{shard.ref}", daemon=True)
        self.node, self.shard, self.lane = node, shard, lane
        self.wake = threading.Event()

    def run(self) -> None:
        node, shard = self.node, self.shard
        backoff = 0.5
        while not node.stopping.is_set():
            if not self.wake.wait(0.5):
                continue
            try:
                messages = node.app.broker.receive(
                    shard.queue,
                    max_messages=MAX_BATCH_ENTRIES,
                    wait_seconds=node.config.idle_wait_seconds,
                    visibility_timeout=shard.visibility_timeout,
                )
            except BrokerError as exc:
                node.metrics.broker_error("poll")
                log.warning("node.poll_failed", queue=shard.queue, error=str(exc), retry_in=backoff)
                node.stopping.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            if not messages:
                continue
            node.heartbeat.hold(messages, shard.visibility_timeout)
            if node.stopping.is_set():
                release(node.app, node.heartbeat, messages)
                return
            self.wake.clear()
            self.lane.inbox.put((shard, messages))


def release(app: App, heartbeat: Heartbeat, messages: list[Message]) -> None:
    """Make held messages visible again at once (they were not started)."""
    heartbeat.drop([m.receipt for m in messages])
    by_queue: dict[str, list[Message]] = {}
    for m in messages:
        by_queue.setdefault(m.queue, []).append(m)
    for queue_name, items in by_queue.items():
        for chunk in batches(items):
            try:
                app.broker.change_visibility_batch(queue_name, [(m.receipt, 0) for m in chunk])
            except BrokerError as exc:
                log.warning(
                    "node.release_failed",
                    queue=queue_name,
                    error=str(exc),
                    detail="they reappear after their visibility timeout",
                )
    if messages:
        log.info("node.released", messages=len(messages))


def _heartbeat_interval(app: App, plan: Plan) -> float:
    """Beat often enough for the shortest visibility timeout of the plan."""
    shortest = min((app.settings(ref.worker).visibility_timeout for ref in plan.shards), default=60)
    return max(0.1, min(1.0, shortest / 6))
