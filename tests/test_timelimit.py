"""Time limits: when a running ``perform`` is overdue is decided on the node's clock."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.run.timelimit import STUCK_SECONDS, Running, TimeLimitExceeded, TimeLimits, overdue


# -- the decision, on plain data ----------------------------------------------------------
def test_only_calls_past_their_deadline_are_overdue_and_the_watch_waits_for_the_next() -> None:
    # given calls due at 10 and 20, one due at 5 already interrupted, one at 6 done
    early, late = Running(1, 10.0), Running(2, 20.0)
    fired, done = Running(3, 5.0, fired=True), Running(4, 6.0, done=True)
    # when the watch looks at 15
    due, wait = overdue([early, late, fired, done], 15.0)
    # then only the call due at 10 is to be interrupted, and the next look is in 5 s
    assert due == [early]
    assert wait == 5.0


@pytest.mark.parametrize(
    ("running", "expected"),
    [([], 1.0), ([Running(1, 100.001)], 0.005), ([Running(1, 10.0, done=True)], 1.0)],
)
def test_the_watch_looks_again_in_a_second_when_nothing_is_due_and_never_sooner_than_5_ms(
    running: list[Running], expected: float
) -> None:
    assert overdue(running, 100.0) == ([], expected)


def test_a_call_is_due_at_its_limit_exactly() -> None:
    call = Running(1, 10.0)
    assert overdue([call], 10.0)[0] == [call]
    assert overdue([call], 9.999)[0] == []


# -- the watch, on a clock the test moves ----------------------------------------------------
def test_a_call_is_interrupted_once_the_clock_passes_its_limit_not_before() -> None:
    # given time limits on a clock the test moves, and a 0.05 s limit
    clock = ManualClock()
    limits = TimeLimits(clock)
    phases: list[str] = []

    def compute() -> None:
        # a tenth of a second of real time passes, but not on the clock
        until = time.monotonic() + 0.1
        while time.monotonic() < until:
            pass
        phases.append("not interrupted while the clock stood still")
        clock.advance(1.0)
        until = time.monotonic() + 30
        while time.monotonic() < until:  # pure Python: interruptible
            pass
        phases.append("ran on past the limit")

    # when a call computes, and the clock passes its limit
    with pytest.raises(TimeLimitExceeded):
        limits.run(compute, 0.05)
    limits.close()
    # then it is interrupted only after the clock moved
    assert phases == ["not interrupted while the clock stood still"]


def test_an_interrupted_call_that_swallowed_the_interruption_still_overran() -> None:
    # given time limits on a clock the test moves, and a call that catches everything
    clock = ManualClock()
    limits = TimeLimits(clock)

    def swallow() -> str:
        clock.advance(1.0)
        try:
            until = time.monotonic() + 30
            while time.monotonic() < until:
                pass
        except TimeLimitExceeded:
            return "swallowed"
        return "ran on"

    # when it runs past its limit
    result, overran = limits.run(swallow, 0.05)
    limits.close()
    # then it returned, and the overrun is still known
    assert (result, overran) == ("swallowed", True)


def test_a_long_limit_is_enforced_soon_after_the_clock_jumps_past_it() -> None:
    # given time limits on a clock the test moves, and a call with a 60 s limit
    clock = ManualClock()
    limits = TimeLimits(clock)

    def compute() -> str:
        clock.advance(61)  # when the clock jumps past the limit while it computes
        until = time.monotonic() + 30
        while time.monotonic() < until:  # pure Python: interruptible
            pass
        return "ran on"

    # then it is interrupted within a fraction of a second, not 60 s of real time later
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        limits.run(compute, 60)
    limits.close()
    assert time.monotonic() - started < 5


def test_a_call_without_a_limit_runs_unwatched() -> None:
    limits = TimeLimits(ManualClock())
    assert limits.run(lambda: 7, None) == (7, False)


# -- a job the limit cannot interrupt, in a node ---------------------------------------------
@pytest.mark.parametrize("kind", ["sync", "async", "async-yielding"])
def test_a_job_stuck_past_its_time_limit_is_named_while_the_node_serves_other_entities(
    kind: str,
) -> None:
    # given a node on a clock the test moves, and a worker with a 1 s limit whose job for
    # entity "stuck" waits in a call the limit cannot interrupt (a sync perform ends when
    # the call does; an async one that never yields holds the event loop; one that yields
    # but ignores its cancellation holds only itself)
    clock, started, release = ManualClock(), threading.Event(), threading.Event()
    done: list[str] = []
    app = shardq.App(Config(queue_prefix="tl-", grace_seconds=1), broker=shardq.MemoryBroker())

    def block(entity_id: str) -> None:
        started.set()
        release.wait(30)

    class Blocking(shardq.Worker):
        shards = 1
        time_limit = 1

        if kind == "sync":

            def perform(self, entity_id: str, payloads: list[Any]) -> None:
                block(entity_id)

        elif kind == "async":

            async def perform(self, entity_id: str, payloads: list[Any]) -> None:  # type: ignore[override]
                block(entity_id)

        else:

            async def perform(self, entity_id: str, payloads: list[Any]) -> None:  # type: ignore[override]
                started.set()
                while not release.is_set():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(0.02)

    @app.register
    class Plain(shardq.Worker):
        shards = 1

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            done.append(entity_id)

    app.register(Blocking)
    Blocking.publish("stuck", {})
    node = app.node(app.plan(threads=1), clock=clock)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(node.run()))
    with capture_logs() as logs:
        runner.start()
        assert started.wait(10)
        # when the clock passes its limit and STUCK_SECONDS more, and another entity's job comes
        clock.advance(1 + STUCK_SECONDS)
        Plain.publish("other", {})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            done and any(e["event"] == "job.stuck" for e in logs)
        ):
            time.sleep(0.02)
        # and when the node is stopped while it still runs
        node.stop()
        runner.join(30)
        release.set()
    # then the other entity's job ran, and the stuck one was named once, with its limit
    assert done == ["other"]
    stuck = [e for e in logs if e["event"] == "job.stuck"]
    assert [(e["worker"], e["entity"], e["time_limit"], e["log_level"]) for e in stuck] == [
        ("Blocking", "stuck", 1, "warning")
    ]
    # and the node exited 3 after its grace period, naming the entity still running
    assert result == [3]
    expired = [e for e in logs if e["event"] == "node.grace_expired"]
    assert [(e["running_jobs"], e["entities"]) for e in expired] == [(1, ["stuck"])]


class _Entered(shardq.Middleware):
    """Notes the entity of each perform call as it starts."""

    def __init__(self) -> None:
        self.entered: list[str] = []

    def around_perform(self, call: Any, ctx: Any) -> None:
        self.entered.append(ctx.entity_id)
        call()


def _app_noting_entries(prefix: str) -> tuple[shardq.App, list[str]]:
    """An app (grace 1 s) whose list names each perform call's entity as it starts."""
    app = shardq.App(Config(queue_prefix=prefix, grace_seconds=1), broker=shardq.MemoryBroker())
    app.add_middleware(noting := _Entered())
    return app, noting.entered


def _noting_handoffs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A list that grows as each async call is handed to the node's event loop: from then
    on the call waits on the loop (before, in its middleware, it holds its own thread up)."""
    handed: list[object] = []
    hand_over = asyncio.run_coroutine_threadsafe

    def noted(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        handed.append(future := hand_over(coro, loop))
        return future

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", noted)
    return handed


@pytest.mark.parametrize("in_a_child_task", [False, True])
def test_only_the_async_job_holding_the_event_loop_is_named_not_those_waiting_behind_it(
    in_a_child_task: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node on a clock the test moves and an async worker with a 1 s limit: one job
    # awaits, then the job of "culprit" blocks the event loop (itself, or in a task it
    # started), and two more jobs are handed to the loop behind it (they cannot start, nor
    # be cancelled, until it yields)
    clock, awaiting, blocked, release = (
        ManualClock(),
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    app, entered = _app_noting_entries("tv-")
    handed = _noting_handoffs(monkeypatch)

    @app.register
    class Loop(shardq.Worker):
        shards = 1
        time_limit = 1

        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            if entity_id == "awaiting":
                awaiting.set()
                await asyncio.sleep(30)
            elif entity_id == "culprit":
                while not awaiting.is_set():
                    await asyncio.sleep(0.01)
                await (asyncio.create_task(hold()) if in_a_child_task else hold())

    async def hold() -> None:
        blocked.set()
        release.wait(30)  # holds the loop

    for entity in ("awaiting", "culprit", "queued-1", "queued-2"):
        Loop.publish(entity, {})
    node = app.node(app.plan(threads=1), clock=clock)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        runner.start()
        assert blocked.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(handed) < 4:
            time.sleep(0.02)
        assert sorted(entered) == ["awaiting", "culprit", "queued-1", "queued-2"]
        # when the clock passes their limit and STUCK_SECONDS more
        clock.advance(1 + STUCK_SECONDS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e["event"] == "job.stuck" for e in logs):
            time.sleep(0.02)
        time.sleep(0.2)  # (on a test clock the watch looks again every 0.05 s)
        named = [e["entity"] for e in logs if e["event"] == "job.stuck"]
        node.stop()
        release.set()
        runner.join(30)
    # then only the job holding the loop was named
    assert named == ["culprit"]


def test_an_async_job_that_started_late_behind_the_culprit_is_not_named_within_its_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a node on a clock the test moves and an async worker with a 1 s limit: the job of
    # "culprit" blocks the event loop, and the job of "queued-1" is handed to the loop behind it
    clock, blocked, release, started = (
        ManualClock(),
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    app, entered = _app_noting_entries("tw-")
    handed = _noting_handoffs(monkeypatch)

    @app.register
    class Loop(shardq.Worker):
        shards = 1
        time_limit = 1

        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            if entity_id == "culprit":
                blocked.set()
                release.wait(30)  # holds the loop
            else:
                started.set()
                await asyncio.sleep(30)  # awaits within its limit, counted from its start

    for entity in ("culprit", "queued-1"):
        Loop.publish(entity, {})
    node = app.node(app.plan(threads=1), clock=clock)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        runner.start()
        assert blocked.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(handed) < 2:
            time.sleep(0.02)
        assert sorted(entered) == ["culprit", "queued-1"]
        clock.advance(1 + STUCK_SECONDS)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e["event"] == "job.stuck" for e in logs):
            time.sleep(0.02)
        # when the culprit yields and the waiting job starts, its deadline long passed
        release.set()
        assert started.wait(10)
        time.sleep(0.3)  # (on a test clock the watch looks again every 0.05 s)
        named = [e["entity"] for e in logs if e["event"] == "job.stuck"]
        node.stop()
        runner.join(30)
    # then it is not named: it has not run for its limit and STUCK_SECONDS since it started
    assert named == ["culprit"]
