"""A node's graceful shutdown (first SIGTERM/SIGINT/SIGHUP, or ``Node.stop``; a second
signal exits at once). See docs/design/run.md.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

import structlog

from shardq.core.exits import EXIT_ERROR, EXIT_GRACE_EXPIRED, EXIT_OK
from shardq.core.lease import HELD, hand_back
from shardq.core.middleware import notify
from shardq.run.waits import Deadline

if TYPE_CHECKING:
    from shardq.core.clock import Clock
    from shardq.core.config import Config
    from shardq.core.outcome import Tally
    from shardq.core.signals import StopSignals
    from shardq.run.executor import Executor
    from shardq.run.idle import Pollers, Watcher
    from shardq.run.intake import Intake
    from shardq.run.lane import Lane
    from shardq.run.leases import Leases
    from shardq.run.metrics import NodeMetrics
    from shardq.run.ownership import Ownership
    from shardq.run.parts import Membership
    from shardq.run.slots import Slots
    from shardq.run.threads import Threads
    from shardq.run.timelimit import TimeLimits
    from shardq.store.deployment import Deployment


class Stopping(Protocol):
    """What a shutdown stops: the parts of a :class:`~shardq.run.node.Node`."""

    app: Deployment
    clock: Clock
    config: Config
    signals: StopSignals
    lanes: list[Lane]
    intake: Intake
    idle: Pollers | Watcher
    slots: Slots
    executor: Executor
    pool: ThreadPoolExecutor
    lease_pool: ThreadPoolExecutor
    leases: Leases
    fleet: Membership | None
    limits: TimeLimits
    metrics: NodeMetrics
    ownership: Ownership
    threads: Threads
    failed: bool
    id: str

    def tally(self) -> Tally: ...


log = structlog.get_logger("shardq.node")

#: Longest wait for pending deletes and releases at shutdown.
FLUSH_SECONDS = 5.0
#: Longest wait for a receive in flight on a queue where jobs were released at shutdown.
STRAGGLER_SECONDS = 1.0
#: Longest wait for the node's threads to end (those not in a long poll or a job end at once).
THREADS_SECONDS = 0.2


def shut_down(node: Stopping) -> int:
    """Stop every part of a node that was asked to stop; returns its exit code."""
    if node.signals.name:
        log.info(
            "node.signal",
            signal=node.signals.name,
            detail="finishing running jobs; send it again to exit at once",
        )
    node.app.broker.wake_waiters()
    log.info("node.stopping", grace_seconds=node.config.grace_seconds)
    grace = Deadline(node.clock, node.config.grace_seconds)
    for lane in node.lanes:
        lane.join(grace.left())
    node.slots.close()
    node.slots.join(grace.left())
    node.executor.perform.loop.close()
    # receives in flight are not waited for: what they bring is released (Lane._fetch)
    node.pool.shutdown(wait=False, cancel_futures=True)
    # A job still running keeps its entity's later jobs (they reappear after it).
    running = {m.receipt for m in node.slots.running()}
    held = node.leases.held(HELD)
    for messages, seconds in hand_back(held, running, node.slots.retries(), node.clock()):
        node.leases.hide(messages, seconds)
    flushed = node.leases.close(FLUSH_SECONDS)
    released = [m for m in held if m.receipt not in running]
    # a long poll in flight may take what was just released: let it hand that back
    node.intake.quiet({m.queue for m in released}, STRAGGLER_SECONDS)
    if node.fleet is not None:
        node.fleet.leave()  # after every job message is settled: hand the shards back
    node.lease_pool.shutdown(wait=False)
    node.limits.close()
    node.metrics.close()
    notify(node.app.middleware, "on_node_stop", node)
    node.ownership.finish()
    node.idle.wake()
    left = node.threads.left(THREADS_SECONDS)
    if left:
        log.info(
            "node.threads_left",
            threads=left,
            detail="still in a receive (a long poll cannot be cut short), a job, a store "
            "call or a handover; what a receive brings is released while the process lives, and "
            "reappears after its visibility timeout if the process exits first",
        )
    tally = node.tally()
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
        return EXIT_GRACE_EXPIRED
    return EXIT_ERROR if node.failed else EXIT_OK
