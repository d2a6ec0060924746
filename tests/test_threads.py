"""The node's threads have one owner (:mod:`shardq.run.threads`): a part whose thread
raises stops the node with exit code 1 and says which part; at shutdown the threads
still running are named."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import start_http_server
from structlog.testing import capture_logs

import shardq
from shardq.broker import SendEntry
from shardq.core.config import Config
from shardq.run import metrics
from shardq.run.leases import Leases
from shardq.run.threads import Threads, describe, side_by_side


def test_a_thread_that_raises_is_reported_with_its_part_and_ends() -> None:
    # given a supervisor recording failures
    failures: list[tuple[str, str, str]] = []
    threads = Threads(lambda what, exc: failures.append((what, repr(exc), current())))

    def current() -> str:
        return threading.current_thread().name

    # when a thread it started raises
    def broken() -> None:
        raise RuntimeError("bug")

    thread = threads.start("shardq-test", "the test part", broken)
    thread.join(5)
    # then the failure names the part and was reported in that thread, which ended
    assert failures == [("the test part", "RuntimeError('bug')", "shardq-test")]
    assert threads.left(0.0) == []


def test_a_failure_handler_that_raises_still_leaves_the_failure_logged() -> None:
    # given a supervisor whose failure handler itself raises
    def handler(what: str, exc: BaseException) -> None:
        raise ValueError("handler bug")

    threads = Threads(handler)
    # when a thread it started raises
    with capture_logs() as logs:
        threads.start("shardq-test", "the test part", lambda: 1 / 0 and None).join(5)
    # then the failure is logged, naming the handler's own error
    assert [(e["event"], e["part"]) for e in logs] == [
        ("node.part_failed", "the test part (its failure handler raised ValueError: handler bug)")
    ]


def test_left_names_the_threads_still_running_after_the_wait() -> None:
    # given one thread that ends at once and one that waits for a release
    threads = Threads()
    release = threading.Event()
    threads.start("shardq-quick", "a quick part", lambda: None)
    threads.start("shardq-stuck", "a stuck part", lambda: release.wait(10) and None)
    # when a shutdown waits 0.05 s for them
    left = threads.left(0.05)
    # then only the stuck one is named; once released, none is
    assert left == ["shardq-stuck"]
    release.set()
    assert threads.left(5.0) == []


def test_the_default_supervisor_logs_a_failure() -> None:
    threads = Threads()
    with capture_logs() as logs:
        threads.start("shardq-test", "the test part", lambda: 1 / 0 and None).join(5)
    assert [(e["event"], e["part"], e["log_level"]) for e in logs] == [
        ("node.part_failed", "the test part", "error")
    ]
    assert logs[0]["error"].startswith("ZeroDivisionError")


class _CrashingDeletes(shardq.MemoryBroker):
    """A broker with a bug: deletes raise an error that cannot print its message."""

    def delete_batch(self, queue: str, receipts: Any) -> Any:
        raise Unprintable()


def test_side_by_side_makes_its_calls_parallel_at_a_time() -> None:
    # given 6 calls that each wait for two others under way (one at a time, they would
    # wait in vain), counting how many run at once
    lock, together = threading.Lock(), threading.Barrier(3, timeout=30)
    running, most, betweens, daemons = [0], [0], [], set()

    def call() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            daemons.add(threading.current_thread().daemon)
        together.wait()
        with lock:
            running[0] -= 1

    # when they are made 3 at a time
    side_by_side([call] * 6, 3, between=lambda: betweens.append(1))
    # then 3 ran at once, never more, and ``between`` came before each was begun; each ran
    # in a daemon thread (one stuck at exit does not hold the process)
    assert most[0] == 3 and not together.broken and len(betweens) >= 3 and daemons == {True}


def test_side_by_side_begins_none_once_told_to_stop_and_raises_what_a_call_raised() -> None:
    # given calls the first of which says stop, and calls the first of which raises
    stop, ran = threading.Event(), []

    def first() -> None:
        stop.set()
        ran.append(1)

    stopping = [first] + [lambda: ran.append(1)] * 4

    def broken() -> None:
        raise ValueError("bug")

    # when each list is made one at a time
    side_by_side(stopping, 1, until=stop)
    # then none was begun after the stop, and the error of a call is raised to the caller
    assert ran == [1]
    with pytest.raises(ValueError, match="bug"):
        side_by_side([broken, lambda: ran.append(2)], 1)
    assert ran == [1]


def test_side_by_side_whose_between_raises_ends_the_calls_under_way_first() -> None:
    # given a call that ends a while after it is let go, and a ``between`` that lets it
    # go and raises while it runs
    go, ended, betweens = threading.Event(), [], []

    def call() -> None:
        go.wait(30)
        time.sleep(0.2)
        ended.append(1)

    def between() -> None:
        betweens.append(1)
        if len(betweens) == 2:
            go.set()
            raise RuntimeError("between")

    # when the call is made
    with pytest.raises(RuntimeError, match="between"):
        side_by_side([call], 1, between=between, every=1.0)
    # then the error came once the call under way had ended; 0 calls a time is refused
    assert ended == [1]
    with pytest.raises(ValueError, match="parallel"):
        side_by_side([call], 0)
    # and a call stuck for good holds the error 5 ``every``s at most (it goes on alone)
    stuck, looks, finished = threading.Event(), [], []

    def stuck_call() -> None:
        stuck.wait(30)
        finished.append(1)

    def raising_second() -> None:
        looks.append(1)
        if len(looks) == 2:
            raise RuntimeError("between")

    with pytest.raises(RuntimeError, match="between"):
        side_by_side([stuck_call], 1, between=raising_second, every=0.01)
    assert finished == []
    stuck.set()


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: _CrashingDeletes(), "Unprintable"),  # an error that cannot print its message
        (lambda: _FatalDeletes(), "_Fatal: delete interrupted"),  # a BaseException, no Exception
    ],
)
def test_a_crashed_request_is_reported_even_if_its_error_cannot_print_or_is_no_exception(
    make: Any, error: str
) -> None:
    # given leases on a broker whose deletes raise such an error
    broker = make()
    broker.ensure_queue("q.fifo")
    broker.send_batch("q.fifo", [SendEntry("0", "body", "g", "d0")])
    messages = broker.receive("q.fifo", max_messages=1, wait_seconds=0, visibility_timeout=30)
    failures: list[tuple[str, str]] = []
    reported = threading.Event()

    def failed(what: str, exc: BaseException) -> None:
        failures.append((what, describe(exc)))
        reported.set()

    leases = Leases(broker, ThreadPoolExecutor(1), threads=Threads(failed))
    leases.hold(messages, 30)
    leases.start()
    # when its job is deleted
    with capture_logs():
        leases.delete(messages)
        # then the crash is reported (the node stops), naming the request's queue, not
        # left in the pool's future
        assert reported.wait(10)
        leases.close(0.0)
    assert failures[0] == ("a request to q.fifo", error)


app = shardq.App()


@app.register
class Quiet(shardq.Worker):
    shards = 2
    time_limit = 5  # its jobs run under the node's time-limit watch

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        return None


class Unprintable(Exception):
    """A bug whose message itself fails."""

    def __str__(self) -> str:
        raise AttributeError("no message")


def _break(node: Any, part: str) -> None:
    """Make ``part`` of ``node`` raise on its first round."""

    def broken(*args: Any) -> None:
        raise (Unprintable() if part == "lane 0" else RuntimeError("bug in a part"))

    if part == "the layout keeper":
        node.layout.tick = broken
    elif part == "the fleet membership":
        node.fleet.step = broken
    elif part == "lane 0":
        node.lanes[0].pick = broken
    else:
        node.limits._watch = broken


@pytest.mark.parametrize(
    "part", ["the layout keeper", "the fleet membership", "lane 0", "the time-limit watch"]
)
def test_a_part_of_a_node_that_raises_stops_the_node_with_exit_1(part: str) -> None:
    # given a static node on the embedded broker, one job waiting, and a part of the
    # node that raises on its first round (a lane's with an error that cannot even
    # print its message)
    app.configure(Config(grace_seconds=2), broker=shardq.MemoryBroker())
    Quiet.publish("order-1", {"n": 1})
    node = app.node(app.plan(threads=1), membership="static")
    _break(node, part)
    # when the node runs (it would run until stopped)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(node.run()))
    with capture_logs() as logs:
        runner.start()
        runner.join(30)
    # then it stopped by itself with exit code 1 and named the part and its error
    assert not runner.is_alive()
    assert result == [1]
    failed = [(e["part"], e["error"]) for e in logs if e["event"] == "node.part_failed"]
    error = "Unprintable" if part == "lane 0" else "RuntimeError: bug in a part"
    assert failed == [(part, error)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_metrics_server_whose_thread_dies_stops_the_node_with_exit_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a node serving metrics whose server thread raises once it serves
    def failing_server(*args: Any, **kwargs: Any) -> Any:
        server, thread = start_http_server(*args, **kwargs)
        server.service_actions = lambda: _raise(RuntimeError("bug in the metrics server"))
        return server, thread

    monkeypatch.setattr(metrics, "start_http_server", failing_server)
    app.configure(Config(grace_seconds=2, metrics_port=0), broker=shardq.MemoryBroker())
    node = app.node(app.plan(threads=1), membership="static")
    # when the node runs (it would run until stopped)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(node.run()))
    with capture_logs() as logs:
        runner.start()
        runner.join(30)
    # then it stopped by itself with exit code 1, naming the metrics server
    assert not runner.is_alive()
    assert result == [1]
    failed = [(e["part"], e["error"]) for e in logs if e["event"] == "node.part_failed"]
    assert failed == [
        (
            "the metrics server",
            f"MetricsServerError: the metrics server on 127.0.0.1:{node.metrics_port} stopped "
            "serving /metrics (its thread ended; its error, if any, is printed above)",
        )
    ]


@pytest.mark.parametrize("attempt", range(5))  # its server thread ends as it is closed
def test_a_node_serving_metrics_that_is_stopped_exits_0_without_a_failure(attempt: int) -> None:
    # given a node serving metrics
    app.configure(Config(grace_seconds=1, metrics_port=0), broker=shardq.MemoryBroker())
    node = app.node(app.plan(threads=1), membership="static")
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(node.run()))
    with capture_logs() as logs:
        runner.start()
        deadline = time.monotonic() + 10
        while node.metrics_port is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # when it is stopped
        node.stop()
        runner.join(30)
    # then it exits 0 and reports no part failed (closing its server is no failure)
    assert result == [0]
    assert [e for e in logs if e["event"] == "node.part_failed"] == []


def _raise(exc: BaseException) -> None:
    raise exc


class _Fatal(BaseException):
    """Not an Exception (as SystemExit or asyncio.CancelledError are not)."""


class _FatalDeletes(shardq.MemoryBroker):
    def delete_batch(self, queue: str, receipts: Any) -> Any:
        raise _Fatal("delete interrupted")
