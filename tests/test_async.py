"""``async def perform``: on the node's event loop, under its concurrency, with the same
order, retry, morgue, time limit and shutdown rules as sync workers."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.core.config import Config
from shardq.ops.testing import drain as drain_queued
from shardq.ops.testing import use_memory_broker
from tests.conftest import make_broker
from tests.test_slots import morgue_records
from tests.test_slots import run_until_empty as drain


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> shardq.App:
    broker = make_broker(str(request.param), tmp_path, request)
    prefix = f"a{time.monotonic_ns() % 10**9}-"
    app = shardq.App(
        Config(queue_prefix=prefix, grace_seconds=10, idle_wait_seconds=1, concurrency=8),
        broker=broker,
    )
    app.store.ensure_table()  # DynamoDB's, as `shardq queues ensure` makes it
    return app


def test_async_and_sync_workers_run_in_one_node_in_order_with_retries_and_the_morgue(
    app: shardq.App,
) -> None:
    # given an async worker (entity "bad" always fails, one retry) and a sync worker,
    # 16 entities x 3 jobs of the async one, a node with concurrency 8
    seen: dict[str, list[int]] = {}
    running, peak, sync_runs = [0], [0], []

    @app.register
    class Fetch(shardq.Worker):
        shards = 2
        max_retries = 1

        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            seen.setdefault(entity_id, []).append(payloads[0])
            running[0] += 1  # one loop thread: no lock needed
            peak[0] = max(peak[0], running[0])
            try:
                await asyncio.sleep(0.05)
                if entity_id == "bad":
                    raise RuntimeError("the remote said no")
            finally:
                running[0] -= 1

        def retry_in(self, attempt: int) -> float:
            return 0.0

    @app.register
    class Count(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            sync_runs.append(payloads[0])

    Fetch.publish_many([(f"e{e}", n) for n in range(3) for e in range(16)] + [("bad", 0)])
    Count.publish_many([("c", n) for n in range(5)])
    # when the node drains them
    node = app.node(app.plan(threads=2), until_empty=True)
    assert drain(node) == 0
    # then each entity ran in order, up to 8 at once on the loop, the failing one ran
    # twice and went to the morgue; the sync worker ran too
    assert {e: seen[e] for e in seen if e != "bad"} == {f"e{e}": [0, 1, 2] for e in range(16)}
    assert seen["bad"] == [0, 0]
    assert 2 <= peak[0] <= 8
    (record,) = morgue_records(app, "Fetch")
    assert (record.entity_id, record.error_type) == ("bad", "RuntimeError")
    assert sync_runs == [0, 1, 2, 3, 4]
    assert node.tally().succeeded == {"Fetch": 48, "Count": 5}


def test_an_async_time_limit_cancels_the_await_and_fails_the_attempt(app: shardq.App) -> None:
    # given an async worker with a 0.2 s time limit whose perform awaits for 30 s
    cancelled: list[str] = []

    @app.register
    class Slow(shardq.Worker):
        max_retries = 0
        time_limit = 0.2

        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(entity_id)
                raise

    Slow.publish("e", 0)
    # when a node runs it
    started = time.monotonic()
    assert drain(app.node(app.plan(threads=1), until_empty=True)) == 0
    # then the await was cancelled (the job did not sit out its 30 s) and it went to
    # the morgue as a time limit failure
    assert cancelled == ["e"]
    assert time.monotonic() - started < 25
    (record,) = morgue_records(app, "Slow")
    assert record.error_type == "TimeLimitExceeded"


@pytest.mark.parametrize("escape", [asyncio.CancelledError, SystemExit, KeyboardInterrupt])
def test_an_async_perform_raising_cancelled_error_or_system_exit_is_a_failed_attempt(
    app: shardq.App, escape: type[BaseException]
) -> None:
    # given an async worker whose first attempt raises CancelledError itself, SystemExit
    # or KeyboardInterrupt (asyncio would stop the node's event loop with the last two)
    attempts: list[int] = []

    @app.register
    class Flaky(shardq.Worker):
        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            attempts.append(self.attempt)
            if self.attempt == 1:
                raise escape

        def retry_in(self, attempt: int) -> float:
            return 0.0

    Flaky.publish("e", 0)
    # when a node runs it
    node = app.node(app.plan(threads=1), until_empty=True)
    # then the attempt failed and was retried, as a sync worker's, and succeeded on its
    # second attempt; the loop and the node stayed up and the node exited 0
    assert drain(node) == 0
    assert attempts == [1, 2]
    assert node.tally().retried == {"Flaky": 1} and node.tally().succeeded == {"Flaky": 1}


def test_a_stop_mid_await_lets_the_job_finish_and_releases_the_rest(app: shardq.App) -> None:
    # given an async job that awaits 0.5 s, and a later job of the same entity
    started, ended, runs = threading.Event(), [], []

    @app.register
    class Wait(shardq.Worker):
        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            runs.append(payloads[0])
            started.set()
            await asyncio.sleep(0.5)
            ended.append(payloads[0])

    Wait.publish_many([("e", 0), ("e", 1)])
    node = app.node(app.plan(threads=1))
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(node.run()))
    runner.start()
    # when the node is stopped while the first job awaits
    assert started.wait(30)
    node.stop()
    runner.join(30)
    # then the running job finished, the later one did not start, the node exited 0
    assert codes == [0]
    assert runs == [0] and ended == [0]
    # and the later job is visible again long before its 60 s visibility timeout (at once,
    # or on SQS once an abandoned long poll that received it released it), the first deleted
    queue = app.shard_queue("Wait", 0)
    deadline, left = time.monotonic() + 20, []
    while not left and time.monotonic() < deadline:
        left = app.broker.receive(queue, max_messages=10, wait_seconds=1, visibility_timeout=30)
    assert len(left) == 1 and left[0].receive_count >= 2  # job 1, received before


def test_a_sync_middleware_wraps_the_whole_awaited_perform(app: shardq.App) -> None:
    # given a middleware recording around perform, and an async worker recording inside
    order: list[str] = []

    class Around(shardq.Middleware):
        def around_perform(self, call: Any, ctx: Any) -> None:
            order.append(f"before {ctx.entity_id}")
            call()
            order.append(f"after {ctx.entity_id}")

    app.add_middleware(Around())

    @app.register
    class Inside(shardq.Worker):
        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            await asyncio.sleep(0.01)
            order.append(f"perform {entity_id}")

    Inside.publish("e", 0)
    # when a node runs it
    assert drain(app.node(app.plan(threads=1), until_empty=True)) == 0
    # then the middleware ran around the whole await
    assert order == ["before e", "perform e", "after e"]


def test_an_async_perform_behind_a_plain_decorator_is_awaited() -> None:
    # given an async perform wrapped by a plain (sync) decorator, as logging decorators
    # often are: calling it returns a coroutine, and the method no longer looks async
    app = shardq.App(Config(broker_url="memory://"))
    use_memory_broker(app)
    ran: list[Any] = []

    def logged(perform: Any) -> Any:
        @functools.wraps(perform)
        def wrapper(*args: Any) -> Any:
            return perform(*args)

        return wrapper

    @app.register
    class Decorated(shardq.Worker):
        @logged
        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            await asyncio.sleep(0)
            ran.append(payloads[0])

    Decorated.publish("e", 1)
    # when its job runs
    result = drain_queued(app)
    # then the coroutine ran before the job counted as done (it was dropped unawaited)
    assert ran == [1]
    assert [r.outcome for r in result.runs] == ["succeeded"]


@pytest.mark.parametrize("limit", [None, 30.0])
def test_a_timeout_error_of_an_async_perform_is_its_own_not_the_time_limit(
    limit: float | None,
) -> None:
    # given an async perform whose own call times out at once (no time limit, or a
    # far one)
    app = shardq.App(Config(broker_url="memory://"))
    use_memory_broker(app)

    @app.register
    class Remote(shardq.Worker):
        max_retries = 0
        time_limit = limit

        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            await asyncio.wait_for(asyncio.Event().wait(), 0.01)  # the remote's timeout

    Remote.publish("e", 1)
    # when its job runs
    (run,) = drain_queued(app).runs
    # then the attempt failed with that TimeoutError, not a time limit it never reached
    assert run.outcome == "morgued"
    assert type(run.error) is TimeoutError
