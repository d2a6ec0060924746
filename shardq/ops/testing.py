"""Testing your workers (docs/testing.md): an in-memory broker, :func:`drain` (runs every
queued job in this thread with the node's own executor, not waiting out retry delays) and
:func:`eager` (each publish runs its jobs; a job that ends in the morgue raises
:class:`JobFailed`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardq.broker import MemoryBroker
from shardq.core.errors import ShardqError
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.core.outcome import MORGUED, RETRIED, SUCCEEDED
from shardq.core.plan import ShardRef
from shardq.core.topology import parse_name
from shardq.publish import Publisher, PublishReport
from shardq.run.executor import Executor, Outcome
from shardq.run.leases import Leases
from shardq.run.timelimit import TimeLimits

if TYPE_CHECKING:
    from shardq.api.app import App
    from shardq.core.jobs import WorkerLike
    from shardq.store.deployment import Deployment


class JobFailed(ShardqError):
    """In eager mode, a published job ended in the morgue; ``error`` is why."""

    def __init__(self, message: str, error: BaseException | None) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True)
class JobRun:
    """One ``perform`` outcome of a job."""

    worker: str
    entity_id: str
    payload: Any
    outcome: str  # one of shardq.core.outcome.KINDS
    error: BaseException | None


@dataclass
class DrainResult:
    """Every outcome of a drain, in the order they happened."""

    runs: list[JobRun] = field(default_factory=list)

    def _of(self, outcome: str) -> list[JobRun]:
        return [r for r in self.runs if r.outcome == outcome]

    @property
    def succeeded(self) -> list[JobRun]:
        return self._of(SUCCEEDED)

    @property
    def retried(self) -> list[JobRun]:
        return self._of(RETRIED)

    @property
    def morgued(self) -> list[JobRun]:
        return self._of(MORGUED)

    def payloads(
        self, worker: type[WorkerLike] | str | None = None, entity_id: str | None = None
    ) -> list[Any]:
        """Payloads of the jobs that succeeded (of a worker, by class or name), in order."""
        if isinstance(worker, type):
            worker = worker.__name__
        return [
            r.payload
            for r in self.succeeded
            if (worker is None or r.worker == worker)
            and (entity_id is None or r.entity_id == entity_id)
        ]

    def job_outcome(self, outcome: Outcome) -> None:
        o = outcome
        self.runs += [JobRun(o.worker, o.entity, p, o.kind, o.error) for p in o.payloads]

    def broker_error(self, operation: str) -> None:
        """Broker errors surface as exceptions in tests; nothing to record."""


def use_memory_broker(app: App) -> MemoryBroker:
    """Point ``app`` at a fresh in-memory broker (FIFO semantics, no file)."""
    broker = MemoryBroker()
    app.configure(broker=broker)
    return broker


_draining = threading.local()


def drain(app: Deployment, *, max_runs: int = 100_000) -> DrainResult:
    """Run every queued job (and those they publish) in this thread, in order per entity,
    retrying at once, until none is left; ShardqError after ``max_runs`` outcomes."""
    result = DrainResult()
    pool = ThreadPoolExecutor(1, "shardq-drain")
    leases = Leases(app.broker, pool, interval=0.5)
    leases.start()
    limits = TimeLimits()
    executor = Executor(app, leases, limits, threading.Event(), [result], max_retry_delay=0.0)
    _draining.active = True

    def check() -> None:
        if len(result.runs) > max_runs:
            raise ShardqError(
                f"drain stopped after {len(result.runs)} job runs (max_runs {max_runs}); a "
                "job keeps failing and retrying (check max_retries) or perform publishes "
                "without end"
            )

    try:
        while _drain_round(app, executor, leases, check):
            check()
    finally:
        _draining.active = False
        executor.perform.loop.close()  # async workers' loop thread
        leases.close(10.0)
        limits.close()
        pool.shutdown(wait=True)
    return result


def _drain_round(
    app: Deployment, executor: Executor, leases: Leases, check: Callable[[], None]
) -> bool:
    """Receive once from every shard queue; True if anything ran. ``check`` raises once
    too many jobs ran."""
    progressed = False
    for name in app.workers:
        for gen_name, count in app.live_shards(name).items():  # a resharded worker's too
            progressed |= _drain_gen(app, executor, leases, gen_name, count, check)
    return progressed


def _drain_gen(
    app: Deployment,
    executor: Executor,
    leases: Leases,
    name: str,
    count: int,
    check: Callable[[], None],
) -> bool:
    """Receive once from every shard of one generation (``Orders@2``); True if anything ran."""
    worker, gen = parse_name(name)
    settings = app.settings(worker)
    progressed = False
    for shard in range(count):
        queue = app.shard_queue(worker, shard, gen)
        app.ensure_queue(queue, worker)
        messages = app.broker.receive(
            queue,
            max_messages=MAX_BATCH_ENTRIES,
            wait_seconds=0,
            visibility_timeout=settings.visibility_timeout,
        )
        if not messages:
            continue
        leases.hold(messages, settings.visibility_timeout)
        retries = executor.run_batch(ShardRef(worker, shard, settings.priority, gen), messages)
        while retries:  # drain retries at once (their delay is capped to 0)
            check()
            retries = [r for d in retries for r in executor.run_batch(d.ref, d.messages)]
        leases.flush(10.0)
        progressed = True
    return progressed


class _EagerPublisher(Publisher):
    def publish_many(self, worker: type[WorkerLike] | str, items: Any) -> PublishReport:
        report = super().publish_many(worker, items)
        if getattr(_draining, "active", False):
            return report  # published from perform: the running drain picks it up
        result = drain(self._app)
        if result.morgued:
            dead = result.morgued[0]
            raise JobFailed(
                f"{dead.worker} job for entity {dead.entity_id!r} ended in the morgue: "
                f"{type(dead.error).__name__}: {dead.error}",
                dead.error,
            ) from dead.error
        return report


@contextmanager
def eager(app: App) -> Iterator[App]:
    """Within the block, ``publish`` runs the published jobs (and what they publish)."""
    saved = app.publisher
    app.publisher = _EagerPublisher(app)
    try:
        yield app
    finally:
        app.publisher = saved


@dataclass
class Harness:
    """What the ``shardq_testing`` fixture gives for one app."""

    app: App
    broker: MemoryBroker

    def drain(self, **kwargs: Any) -> DrainResult:
        return drain(self.app, **kwargs)

    def eager(self) -> Any:
        return eager(self.app)
