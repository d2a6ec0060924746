"""Middleware around perform and publish, node hooks, and how their failures are contained."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.ops.testing import drain
from shardq.run.node import Node


@pytest.fixture
def app() -> Iterator[shardq.App]:
    app = shardq.App(shardq.Config(broker_url="memory://", idle_wait_seconds=1))
    app.ran = []  # type: ignore[attr-defined]

    @app.register
    class Sync(shardq.Worker):
        max_retries = 3

        def retry_in(self, attempt: int) -> float:
            return 0.0

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            app.ran.append((entity_id, payloads[0]["n"]))  # type: ignore[attr-defined]
            if payloads[0].get("fail"):
                raise RuntimeError("job failed")

    yield app
    app.broker.close()


def run(app: shardq.App) -> Node:
    node = app.node(app.plan(threads=1), until_empty=True)
    assert node.run() == 0
    return node


class Recorder(shardq.Middleware):
    def __init__(self, name: str, events: list[Any]) -> None:
        self.name, self.events = name, events

    def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
        self.events.append(
            (self.name, "before", ctx.worker, ctx.entity_id, ctx.payloads, ctx.attempt, ctx.metas)
        )
        call()
        self.events.append((self.name, "after"))

    def on_node_start(self, node: Node) -> None:
        self.events.append((self.name, "start", node.plan.node))

    def on_node_stop(self, node: Node) -> None:
        self.events.append((self.name, "stop"))


def test_middleware_wrap_perform_in_order_and_see_the_jobs_context(app: shardq.App) -> None:
    # given two middleware and a job with metadata
    events: list[Any] = []
    app.add_middleware(Recorder("outer", events))
    app.add_middleware(Recorder("inner", events))
    app.worker("Sync").publish("e1", {"n": 1}, meta={"trace_id": "t-9"})
    # when a node runs it
    run(app)
    # then the first added is outermost, and both saw worker, entity, payloads, attempt, meta
    seen = ("Sync", "e1", [{"n": 1}], 1, [{"trace_id": "t-9"}])
    assert events == [
        ("outer", "start", 0), ("inner", "start", 0),
        ("outer", "before", *seen), ("inner", "before", *seen),
        ("inner", "after"), ("outer", "after"),
        ("outer", "stop"), ("inner", "stop"),
    ]  # fmt: skip


def test_publish_middleware_can_add_metadata_that_perform_middleware_sees(
    app: shardq.App,
) -> None:
    class Trace(shardq.Middleware):
        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            ctx.jobs[:] = [job.with_meta(trace_id="abc") for job in ctx.jobs]
            return call()

    events: list[Any] = []
    app.add_middleware(Trace())
    app.add_middleware(Recorder("r", events))
    app.worker("Sync").publish_many([("e1", {"n": 1}), ("e2", {"n": 2})])
    run(app)
    metas = [e[6] for e in events if e[1] == "before"]
    assert metas == [[{"trace_id": "abc"}], [{"trace_id": "abc"}]]


class Broken(shardq.Middleware):
    def __init__(self, when: str) -> None:
        self.when = when

    def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
        if self.when == "before":
            raise ValueError("middleware bug before")
        call()
        raise ValueError("middleware bug after")

    def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
        raise ValueError("publish middleware bug")

    def on_node_start(self, node: Node) -> None:
        raise ValueError("start hook bug")


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failing_middleware_is_logged_and_the_job_runs_exactly_once(
    app: shardq.App, when: str
) -> None:
    # given a middleware that raises before (or after) calling the job
    app.add_middleware(Broken(when))
    # when a job is published (its publish middleware raises too) and a node runs
    with capture_logs() as logs:
        app.worker("Sync").publish("e1", {"n": 1})
        node = run(app)
    # then the job ran once and succeeded, and each failure was logged with context
    assert app.ran == [("e1", 1)]  # type: ignore[attr-defined]
    assert node.tally().succeeded == {"Sync": 1}
    failures = [(e["hook"], e.get("entity")) for e in logs if e["event"] == "middleware.failed"]
    assert failures == [("around_publish", None), ("on_node_start", None), ("around_perform", "e1")]


def test_a_middleware_cannot_hide_a_jobs_failure(app: shardq.App) -> None:
    class Swallow(shardq.Middleware):
        def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
            with contextlib.suppress(RuntimeError):
                call()

    app.add_middleware(Swallow())
    app.worker("Sync").publish("e1", {"n": 1, "fail": True})
    node = run(app)
    assert node.tally().retried == {"Sync": 3} and node.tally().morgued == {"Sync": 1}
    assert len(app.ran) == 4  # type: ignore[attr-defined]


def test_only_middleware_instances_are_accepted(app: shardq.App) -> None:
    with pytest.raises(TypeError, match=r"not a shardq\.Middleware"):
        app.add_middleware(object())  # type: ignore[arg-type]


def test_a_publish_middleware_that_returns_nothing_still_gives_the_message_ids(
    app: shardq.App,
) -> None:
    # given a publish middleware that calls the publish but forgets to return its result
    class NoReturn(shardq.Middleware):
        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            call()

    app.add_middleware(NoReturn())
    worker = app.worker("Sync")
    # when jobs are published (one, then two)
    message_id = worker.publish("e1", {"n": 1})
    report = worker.publish_many([("e2", {"n": 2}), ("e3", {"n": 3})])
    # then publish still answers what the broker said, and each job runs once
    assert isinstance(message_id, str) and report.sent == 2
    run(app)
    assert sorted(app.ran) == [("e1", 1), ("e2", 2), ("e3", 3)]  # type: ignore[attr-defined]


class HookStopped(BaseException):
    """Not an Exception: as asyncio.CancelledError or a library's own stop signal."""


def test_node_hooks_raising_a_base_exception_are_logged_and_the_node_runs_and_stops(
    app: shardq.App,
) -> None:
    # given start and stop hooks that raise a BaseException that is not an Exception
    class Stopping(shardq.Middleware):
        def on_node_start(self, node: Node) -> None:
            raise HookStopped("start hook")

        def on_node_stop(self, node: Node) -> None:
            raise HookStopped("stop hook")

    app.add_middleware(Stopping())
    app.worker("Sync").publish("e1", {"n": 1})
    # when a node runs until its queues are empty
    with capture_logs() as logs:
        node = run(app)
    # then the job ran, the node stopped cleanly, and both failures were logged
    assert app.ran == [("e1", 1)]  # type: ignore[attr-defined]
    assert node.tally().succeeded == {"Sync": 1}
    failures = [e["hook"] for e in logs if e["event"] == "middleware.failed"]
    assert failures == ["on_node_start", "on_node_stop"]


def test_worker_hooks_raising_a_base_exception_are_contained(app: shardq.App) -> None:
    # given a worker whose retry_in and retries_exhausted raise a BaseException that is
    # not an Exception, and a job that always fails
    calls: list[str] = []

    @app.register
    class Hooked(shardq.Worker):
        max_retries = 1

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            calls.append("perform")
            raise RuntimeError("job failed")

        def retry_in(self, attempt: int) -> float:
            calls.append("retry_in")
            raise HookStopped("retry_in")

        def retries_exhausted(self, entity_id: str, payloads: list[Any], error: Any) -> None:
            calls.append("retries_exhausted")
            raise HookStopped("retries_exhausted")

    Hooked.publish("e1", {})
    # when its jobs are run
    with capture_logs() as logs:
        result = drain(app)
    # then the job was retried by the default backoff and reached the morgue, the
    # failures logged, and nothing escaped to stop the run
    assert calls == ["perform", "retry_in", "perform", "retries_exhausted"]
    assert [r.outcome for r in result.runs] == ["retried", "morgued"]
    events = [e["event"] for e in logs]
    assert "job.retry_in_failed" in events and "hook.retries_exhausted_failed" in events


@pytest.mark.parametrize("hook", ["around_perform", "around_publish", "on_node_start"])
def test_a_middleware_with_an_async_hook_is_refused(app: shardq.App, hook: str) -> None:
    # given a middleware whose hook is an async def (hooks are called without awaiting)
    async def method(self: Any, *args: Any) -> None:
        return None

    middleware = type("AsyncHook", (shardq.Middleware,), {hook: method})()
    # when it is added / then it is refused naming the hook, and nothing is added
    with pytest.raises(TypeError, match=rf"^AsyncHook\.{hook} is async"):
        app.add_middleware(middleware)
    assert app.middleware == []


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_in_a_publish_middleware_interrupts_the_publish(app: shardq.App, when: str) -> None:
    # given a publish middleware interrupted by Ctrl-C before (or after) it calls call()
    class Interrupted(shardq.Middleware):
        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            if when == "after":
                call()
            raise KeyboardInterrupt

    app.add_middleware(Interrupted())
    # when a job is published, then the interrupt reaches the caller, not a log line
    with capture_logs() as logs, pytest.raises(KeyboardInterrupt):
        app.worker("Sync").publish("e1", {"n": 1})
    assert [e for e in logs if e["event"] == "middleware.failed"] == []
    # and the job was published only if the middleware had called call()
    run(app)
    assert app.ran == ([("e1", 1)] if when == "after" else [])  # type: ignore[attr-defined]


def test_a_keyboard_interrupt_around_a_job_run_in_the_main_thread_does_not_run_it_again(
    app: shardq.App,
) -> None:
    # given a perform middleware that raises KeyboardInterrupt once the job succeeded, and
    # a drain, which runs jobs in the calling (main) thread
    class Interrupted(shardq.Middleware):
        def around_perform(self, call: Callable[[], Any], ctx: shardq.PerformContext) -> None:
            call()
            raise KeyboardInterrupt

    app.add_middleware(Interrupted())
    app.worker("Sync").publish("e1", {"n": 1})
    # when the job is drained
    with capture_logs() as logs:
        result = drain(app)
    # then it ran once and succeeded; the interrupt is the middleware's logged failure
    assert app.ran == [("e1", 1)]  # type: ignore[attr-defined]
    assert len(result.runs) == 1 and not result.morgued
    assert [e["hook"] for e in logs if e["event"] == "middleware.failed"] == ["around_perform"]


def test_a_publish_middleware_that_drops_every_job_publishes_nothing(app: shardq.App) -> None:
    # given a publish middleware that removes every job
    class DropAll(shardq.Middleware):
        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            ctx.jobs[:] = []
            return call()

    app.add_middleware(DropAll())
    worker = app.worker("Sync")
    # when many jobs are published / then the report has no message id in either slot
    report = worker.publish_many([("e1", {"n": 1}), ("e2", {"n": 2})])
    assert report.message_ids == [None, None] and report.sent == 0
    # when one job is published / then no message id exists: the error names the middleware
    with pytest.raises(shardq.PublishError, match=r"around_publish of DropAll dropped") as err:
        worker.publish("e3", {"n": 3})
    assert err.value.sent == 0 and err.value.failed == [(0, "e3", "dropped by DropAll")]
    # and nothing was sent
    run(app)
    assert app.ran == []  # type: ignore[attr-defined]


def test_a_middleware_that_calls_twice_runs_and_publishes_each_job_once(app: shardq.App) -> None:
    # given a middleware that calls through twice (as a naive retry would)
    class Twice(shardq.Middleware):
        def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
            call()
            call()

        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            call()
            return call()

    app.add_middleware(Twice())
    worker = app.worker("Sync")
    # when jobs are published and run
    report = worker.publish_many([("e1", {"n": 1}), ("e1", {"n": 2})])
    # then each job was published once, in order, and ran once
    assert report.sent == 2
    run(app)
    assert app.ran == [("e1", 1), ("e1", 2)]  # type: ignore[attr-defined]


def test_a_call_kept_by_a_middleware_that_did_not_call_it_never_runs_again(
    app: shardq.App,
) -> None:
    # given a middleware that keeps its calls to call them later, and returns without calling
    kept: list[Callable[[], Any]] = []

    class Deferred(shardq.Middleware):
        def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
            kept.append(call)

        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            kept.append(call)

    app.add_middleware(Deferred())
    # when jobs are published and run (each without the middleware), then it calls them all
    report = app.worker("Sync").publish_many([("e1", {"n": 1}), ("e1", {"n": 2})])
    run(app)
    outcomes = [call() for call in kept]
    assert outcomes == [report, None, None]  # the publish's report, then each job's perform
    # then each job was published once and ran once
    run(app)
    assert app.ran == [("e1", 1), ("e1", 2)]  # type: ignore[attr-defined]


def test_a_second_call_from_another_thread_waits_for_the_first_outcome(
    app: shardq.App,
) -> None:
    # given a publish whose broker holds the send until released, and a middleware that
    # calls through on a thread of its own, then (while that send is held) again itself
    entered, release = threading.Event(), threading.Event()
    send_batch = app.broker.send_batch

    def held(queue: str, entries: list[Any]) -> Any:
        entered.set()
        assert release.wait(10)
        return send_batch(queue, entries)

    app.broker.send_batch = held  # type: ignore[method-assign]
    seconds: list[Any] = []

    class Background(shardq.Middleware):
        def around_publish(self, call: Callable[[], Any], ctx: shardq.PublishContext) -> Any:
            first = threading.Thread(target=call)
            first.start()
            assert entered.wait(10)
            threading.Timer(0.2, release.set).start()  # the second call is made before that
            seconds.append(call())
            first.join()

    app.add_middleware(Background())
    # when one job is published
    report = app.worker("Sync").publish_many([("e1", {"n": 1})])
    # then the second call returned the first's report once it was in, not None meanwhile
    assert seconds == [report] and report.sent == 1
    run(app)
    assert app.ran == [("e1", 1)]  # type: ignore[attr-defined]
