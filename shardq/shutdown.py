"""A node's graceful shutdown (first SIGTERM/SIGINT/SIGHUP, or ``Node.stop``).

No new jobs start; the running ``perform`` calls finish within ``grace_seconds``;
every message received but not started is released (visible again at once), held
retries are hidden for what is left of their delay, with their entity's later jobs
behind them (:func:`hand_back`); pending deletes are sent, and the process exits 0.
A second signal exits at once. A message whose job is still running is never
released: if the grace period runs out it becomes visible when its visibility
timeout ends (exit code 3). Long polls still waiting on SQS are abandoned, not
waited for: a job one of them receives afterwards is not run; it is released if the
process still runs, or reappears after its visibility timeout.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from shardq.broker.base import Broker, Message
from shardq.early import STOP_SIGNALS
from shardq.errors import BrokerError
from shardq.lease import HELD
from shardq.limits import MAX_BATCH_ENTRIES
from shardq.middleware import notify

if TYPE_CHECKING:
    from shardq.node import Node

log = structlog.get_logger("shardq.node")

#: Longest wait for pending deletes and releases at shutdown.
FLUSH_SECONDS = 5.0


def hand_back(
    held: list[Message], running: set[str], retries: list[tuple[float, list[Message]]], now: float
) -> list[tuple[list[Message], float]]:
    """What a stopping node hides, in this order, and for how many seconds: each held
    retry for what is left of its delay, the jobs not started behind a retry of their
    entity for as long, one by one, the other jobs not started at once, in order.
    ``running``: receipts of jobs still running, and of their entities' later jobs."""
    out: list[tuple[list[Message], float]] = []
    retry_due: dict[tuple[str, str], float] = {}
    for due, messages in sorted(retries, key=lambda r: r[0]):
        out.append((messages, max(0.0, due - now)))
        retry_due[(messages[0].queue, messages[0].group_id)] = due
    taken = running | {m.receipt for _, messages in retries for m in messages}
    unstarted = sorted(
        (m for m in held if m.receipt not in taken), key=lambda m: (m.queue, m.sequence)
    )
    for m in unstarted:
        behind = retry_due.get((m.queue, m.group_id))
        if behind is not None:
            out.append(([m], max(0.0, behind - now)))
    out.append(([m for m in unstarted if (m.queue, m.group_id) not in retry_due], 0.0))
    return out


def shut_down(node: Node) -> int:
    """Stop every part of a node that was asked to stop; returns its exit code."""
    if node.signals.name:
        log.info(
            "node.signal",
            signal=node.signals.name,
            detail="finishing running jobs; send it again to exit at once",
        )
    node.app.broker.wake_waiters()
    log.info("node.stopping", grace_seconds=node.config.grace_seconds)
    deadline = time.monotonic() + node.config.grace_seconds
    for lane in node.lanes:
        if lane.ident is not None:
            lane.join(max(0.0, deadline - time.monotonic()))
    node.slots.close()
    node.slots.join(max(0.0, deadline - time.monotonic()))
    node.executor.perform.loop.close()
    # Receives still in flight are not waited for: what they bring is released as a
    # straggler (see Lane._fetch).
    node.pool.shutdown(wait=False, cancel_futures=True)
    # A job still running keeps its entity's later jobs (they reappear after it).
    running = {m.receipt for m in node.slots.running()}
    held = node.leases.held(HELD)
    for messages, seconds in hand_back(held, running, node.slots.retries(), time.monotonic()):
        node.leases.hide(messages, seconds)
    flushed = node.leases.close(FLUSH_SECONDS)
    if node.fleet is not None:
        node.fleet.leave()  # after every job message is settled: hand the shards back
    node.lease_pool.shutdown(wait=False)
    node.limits.close()
    node.metrics.close()
    notify(node.app.middleware, "on_node_stop", node)
    node.ownership.finish()
    tally = node.tally()
    log.info(
        "node.stopped",
        succeeded=sum(tally.succeeded.values()),
        retried=sum(tally.retried.values()),
        morgued=sum(tally.morgued.values()),
        released=len([m for m in held if m.receipt not in running]),
        abandoned_running=len(running),
    )
    if not flushed:
        log.warning(
            "node.unsettled",
            messages=node.leases.count(),
            detail="the broker did not confirm every delete or release in time; those "
            "jobs reappear after their visibility timeout",
        )
    if running:
        log.warning(
            "node.grace_expired",
            running_jobs=len(running),
            detail="their messages reappear after their visibility timeout",
        )
        return 3
    failed = node.failed or not node.leases.alive() or any(lane.failed for lane in node.lanes)
    return 1 if failed else 0


class StopSignals:
    """Counts stop signals: the first sets ``stopping``, a second exits at once."""

    def __init__(self, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.count = 0
        self.name: str | None = None

    def install(self, before: int) -> None:
        """Handle them from now on (in the main thread only), counting ``before``
        signals that came earlier."""
        self.count = before
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:  # SIGTERM, SIGINT and SIGHUP
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only flags here: a handler that logged or took a lock could deadlock with
        # the interrupted code. The node's loop logs it and wakes the waiters.
        self.count += 1
        if self.count > 1:
            os._exit(128 + signum)
        self.name = signal.Signals(signum).name
        self.stopping.set()


def release_now(broker: Broker, messages: Sequence[Message]) -> int:
    """Make held messages visible again at once, in this thread, in order (for callers
    without a node: admin operations, and long polls that answered after shutdown).
    Failures are logged, never raised: a message not released reappears after its
    visibility timeout. Returns how many were released."""
    released = 0
    by_queue: dict[str, list[Message]] = {}
    for m in messages:
        by_queue.setdefault(m.queue, []).append(m)
    for queue, items in by_queue.items():
        items.sort(key=lambda m: m.sequence)
        for start in range(0, len(items), MAX_BATCH_ENTRIES):
            chunk = items[start : start + MAX_BATCH_ENTRIES]
            try:
                result = broker.change_visibility_batch(queue, [(m.receipt, 0) for m in chunk])
            except BrokerError as exc:
                log.warning(
                    "lease.release_failed",
                    queue=queue,
                    messages=len(chunk),
                    error=str(exc),
                    detail="they reappear after their visibility timeout",
                )
                continue
            released += len(chunk) - len(result.failed)
    return released
