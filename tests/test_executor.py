"""The executor's retries are due on its clock (the one the slots compare them with);
a ``Retry(at=...)`` is read on its wall clock; a job's duration is taken on its clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

import shardq
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.outcome import DONE, HIDDEN, LATER, EntityEnd, Outcome
from shardq.core.plan import ShardRef
from shardq.run.executor import LOCAL_RETRY_SECONDS, Executor
from shardq.run.leases import Leases
from shardq.run.timelimit import TimeLimits

#: The executor's clock and its wall clock (Unix seconds) when each test starts.
START, WALL = 1_000.0, 1_700_000_000.0


class Durations:
    """An observer that notes each outcome's kind and duration."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def job_outcome(self, outcome: Outcome) -> None:
        self.seen.append((outcome.kind, outcome.duration))

    def broker_error(self, operation: str) -> None:
        """Not counted here."""


@dataclass
class Setup:
    """An app on the in-memory broker whose worker ``Asks`` does what each payload
    says: take ``work`` seconds of ``clock``, then raise ``Retry(**retry)`` if given."""

    app: shardq.App
    worker: type[shardq.Worker]
    clock: ManualClock

    def wall(self) -> float:
        """The wall clock: ``WALL`` when the test starts, moving with ``clock``."""
        return WALL + self.clock.now - START

    def run(self, jobs: list[tuple[str, dict[str, Any]]], *observers: Any) -> list[EntityEnd]:
        """Receive the jobs and run each entity's in turn on the test's clocks."""
        self.worker.publish_many(jobs)
        queue = self.app.shard_queue("Asks", 0)
        broker = self.app.broker
        messages = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=60)
        leases = Leases(broker, ThreadPoolExecutor(1), clock=self.clock, wall_clock=self.wall)
        leases.hold(messages, 60)
        limits = TimeLimits(self.clock)
        executor = Executor(
            self.app,
            leases,
            limits,
            threading.Event(),
            observers,
            clock=self.clock,
            wall_clock=self.wall,
        )
        ref = ShardRef("Asks", 0, self.app.settings("Asks").priority)
        try:
            return list(executor.run_entities(ref, [[m] for m in messages], lambda: False))
        finally:
            limits.close()


@pytest.fixture
def setup() -> Iterator[Setup]:
    app = shardq.App(Config(queue_prefix="x-"), broker=shardq.MemoryBroker())
    clock = ManualClock(START)

    @app.register
    class Asks(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            clock.advance(payloads[0].get("work", 0.0))
            if "retry" in payloads[0]:
                raise shardq.Retry(**payloads[0]["retry"])

    app.store.ensure_table()
    app.ensure_queues()
    yield Setup(app, Asks, clock)
    app.broker.close()


def test_a_retry_is_due_its_delay_after_the_failure_on_the_executors_clock(
    setup: Setup,
) -> None:
    # given a job that works 3 s of the clock, then asks to be retried in 4 s
    assert LOCAL_RETRY_SECONDS >= 4.0
    # when the executor runs it
    (end,) = setup.run([("e", {"work": 3.0, "retry": {"delay": 4.0}})])
    # then it is held here for a retry due 4 s after it failed, on the executor's clock
    assert (end.kind, end.due) == (LATER, START + 3.0 + 4.0)


def test_a_retry_at_a_time_is_read_on_the_wall_clock(setup: Setup) -> None:
    # given jobs of two entities that ask to be retried at a wall-clock time 30 s and
    # 2 s from the test's start
    jobs = [("e", {"retry": {"at": WALL + 30}}), ("f", {"retry": {"at": WALL + 2}})]
    # when the executor runs them
    ends = setup.run(jobs)
    # then the first is hidden at the broker, the second held here, each due then
    assert [(e.kind, e.due) for e in ends] == [(HIDDEN, START + 30.0), (LATER, START + 2.0)]


def test_a_jobs_duration_is_taken_on_the_executors_clock(setup: Setup) -> None:
    # given a job that works 0.25 s of the clock and succeeds
    durations = Durations()
    # when the executor runs it
    (end,) = setup.run([("e", {"work": 0.25})], durations)
    # then its outcome and its run say it took 0.25 s
    assert durations.seen == [("succeeded", 0.25)]
    assert (end.kind, end.performed) == (DONE, 0.25)
