"""A node running real jobs on a real broker: order, retries, morgue, heartbeat, shutdown."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq import morgue
from shardq.broker import Message, SendEntry
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.topology import shard_for
from shardq.ops.ensure import ensure_state_table
from shardq.run.idle import COUNTS_RETRY_SECONDS
from shardq.run.node import Node
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker


@pytest.fixture
def ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "ledger.jsonl")
    ledger.reset()
    monkeypatch.setenv("LEDGER_PATH", path)
    return path


@pytest.fixture(params=["sqlite", "sqlite-reopen", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(request: pytest.FixtureRequest, tmp_path: Path, ledger_path: str) -> Iterator[shardq.App]:
    """The ledger app on the embedded broker, on the same engine with a FIFO defect some
    SQS emulators have (a message group reopens when a later message is released while
    an earlier one is hidden), and on the SQS emulator."""
    broker = make_broker(request.param, tmp_path, request)
    prefix = f"n{time.monotonic_ns() % 10**9}-"
    ledger.app.configure(
        Config(queue_prefix=prefix, grace_seconds=10, idle_wait_seconds=1), broker=broker
    )
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield ledger.app
    broker.close()


def run_until_empty(app: shardq.App, threads: int = 2, timeout: float = 90) -> Node:
    node = app.node(app.plan(threads=threads), until_empty=True, seed=7)
    runner = threading.Thread(target=node.run)
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), "the node did not drain in time"
    return node


def morgue_records(app: shardq.App, worker: str = "Ledgered") -> list[morgue.MorgueRecord]:
    return morgue.Morgue(app, worker).page(limit=100_000).records


def publish_numbered(entities: int, jobs: int, **payload: Any) -> dict[str, int]:
    items = [(f"e{e}", {"n": n, **payload}) for n in range(jobs) for e in range(entities)]
    Ledgered.publish_many(items)
    return {f"e{e}": jobs for e in range(entities)}


def test_random_failures_never_reorder_or_overlap_an_entity(
    app: shardq.App, ledger_path: str
) -> None:
    # given 30 entities with 8 numbered jobs each, 25 % of attempts failing at random
    expected = publish_numbered(30, 8, fail_rate=0.25)
    # when a node with 3 threads runs until every shard is empty
    node = run_until_empty(app, threads=3)
    # then every job succeeded once, in publish order per entity, never two at once
    problems = ledger.check(ledger.read(ledger_path), expected)
    assert problems == {
        "lost": [],
        "order": [],
        "overlap": [],
        "duplicates": [],
        "bad_duplicates": [],
    }
    assert sum(node.tally().retried.values()) > 0


def test_a_retry_holds_back_the_entity_until_the_failed_job_succeeds(
    app: shardq.App, ledger_path: str
) -> None:
    # given job 1 of an entity fails twice and jobs 0..4 are queued together
    Ledgered.publish_many([("e", {"n": n, "fail": 2 if n == 1 else 0}) for n in range(5)])
    # when the node runs
    run_until_empty(app)
    # then jobs 2..4 start only after job 1's third (successful) try
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [
        ("start", 0),
        ("end", 0),
        ("start", 1),
        ("fail", 1),
        ("start", 1),
        ("fail", 1),
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
        ("start", 3),
        ("end", 3),
        ("start", 4),
        ("end", 4),
    ]


def test_a_job_that_always_fails_goes_to_the_morgue_then_the_entity_moves_on(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given max_retries 2, a job that always fails, and a job after it
    monkeypatch.setattr(Ledgered, "max_retries", 2)
    app.configure(app.config, broker=app.broker)  # settings are read again
    exhausted: list[tuple[str, list[Any], str]] = []
    monkeypatch.setattr(
        Ledgered,
        "retries_exhausted",
        lambda self, e, p, err: exhausted.append((e, p, type(err).__name__)),
    )
    Ledgered.publish_many([("e", {"n": 0, "fail": 99}), ("e", {"n": 1})])
    # when the node runs
    with capture_logs() as logs:
        run_until_empty(app)
    # then job 0 ran 3 times, sits in the morgue with its error, and job 1 then ran
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [("start", 0), ("fail", 0)] * 3 + [("start", 1), ("end", 1)]
    (record,) = morgue_records(app)
    assert (record.entity_id, record.reason, record.attempts) == ("e", "max_retries", 3)
    assert record.error_type == "RuntimeError" and "failed on try 3" in record.error_message
    assert "Traceback" in record.traceback
    assert shardq.core.envelope.decode(record.body).payload == {"n": 0, "fail": 99}
    assert exhausted == [("e", [{"n": 0, "fail": 99}], "RuntimeError")]
    morgued = [log for log in logs if log["event"] == "job.morgued"]
    assert [(m["entity"], m["attempt"], m["reason"]) for m in morgued] == [("e", 3, "max_retries")]


def test_a_permanent_error_skips_the_retries(app: shardq.App, ledger_path: str) -> None:
    Ledgered.publish_many([("e", {"n": 0, "permanent": True}), ("e", {"n": 1})])
    run_until_empty(app)
    (record,) = morgue_records(app)
    assert (record.reason, record.attempts, record.error_type) == (
        "permanent_error",
        1,
        "PermanentError",
    )
    assert [e["n"] for e in ledger.read(ledger_path) if e["event"] == "end"] == [1]


def test_an_invalid_message_goes_to_the_morgue_and_the_node_stays_up(
    app: shardq.App, ledger_path: str
) -> None:
    # given garbage, an envelope of another version and one for an unknown worker,
    # then a good job
    queue = app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    app.ensure_queue(queue, "Ledgered")
    stranger = shardq.core.envelope.encode(shardq.core.envelope.Envelope("Gone", "e", {}))
    app.broker.send_batch(
        queue,
        [
            SendEntry("0", "not json at all", "e", "bad-1"),
            SendEntry("1", '{"v": 99, "worker": "Ledgered"}', "e", "bad-2"),
            SendEntry("2", stranger, "e", "bad-3"),
        ],
    )
    Ledgered.publish("e", {"n": 0})
    # when the node runs
    run_until_empty(app)
    # then both bad messages are in the morgue with a reason, and the job ran
    records = morgue_records(app)
    assert [r.reason for r in records] == ["invalid_message", "invalid_message", "unknown_worker"]
    assert "not JSON" in records[0].error_message
    assert "version 99" in records[1].error_message
    assert "no worker 'Gone' is registered" in records[2].error_message
    assert [e["n"] for e in ledger.read(ledger_path) if e["event"] == "end"] == [0]


def test_a_job_longer_than_its_visibility_timeout_is_not_run_twice(
    app: shardq.App, ledger_path: str
) -> None:
    # given a job that runs 3 s with a 2 s visibility timeout, and a second node
    Ledgered.publish_many([("e", {"n": 0, "sleep": 3.0}), ("e", {"n": 1})])
    # when the node runs it (the heartbeat must keep it invisible)
    run_until_empty(app)
    # then it ran exactly once, and job 1 after it
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]


def test_a_time_limit_turns_an_overrun_into_a_failure(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a 0.3 s time limit, retries at once, and a job that computes for much longer
    # the first time
    monkeypatch.setattr(Ledgered, "time_limit", 0.3)
    monkeypatch.setattr(Ledgered, "retry_in", lambda self, attempt: 0.0)
    app.configure(app.config, broker=app.broker)
    calls: list[int] = []

    def perform(self: Ledgered, entity_id: str, payloads: list[Any]) -> None:
        calls.append(1)
        if len(calls) == 1:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # pure Python: interruptible
                pass

    monkeypatch.setattr(Ledgered, "perform", perform)
    Ledgered.publish("e", {"n": 0})
    # when the node runs
    with capture_logs() as logs:
        started = time.monotonic()
        run_until_empty(app)
    # then the first try was stopped and counted as a failure, and the retry succeeded
    assert len(calls) == 2
    retried = [log for log in logs if log["event"] == "job.retried"]
    assert len(retried) == 1 and "TimeLimitExceeded" in retried[0]["error"]
    assert time.monotonic() - started < 25


def test_two_nodes_with_overlapping_plans_never_run_an_entity_twice_at_once(
    app: shardq.App, request: pytest.FixtureRequest, tmp_path: Path, ledger_path: str
) -> None:
    # given two nodes, each with its own broker connection, that both own every shard
    # (jobs of 50 ms: about 2 s of work)
    expected = publish_numbered(20, 6, sleep=0.05, fail_rate=0.1)
    other = shardq.App(app.config, broker=make_broker(app.broker.kind, tmp_path, request))
    # (the first node receives once the second has received jobs, and the second
    # receives again only once the first has had jobs too: one node could otherwise
    # hold every entity's group from one receive to the next and run them all)
    second_has_jobs, first_has_jobs = threading.Event(), threading.Event()
    first_receive, second_receive = app.broker.receive, other.broker.receive

    def first_receives(*args: Any, **kwargs: Any) -> list[Message]:
        second_has_jobs.wait(60)
        got = first_receive(*args, **kwargs)
        if got:
            first_has_jobs.set()
        return got

    def second_receives(*args: Any, **kwargs: Any) -> list[Message]:
        if second_has_jobs.is_set():
            first_has_jobs.wait(60)
        got = second_receive(*args, **kwargs)
        if got:
            second_has_jobs.set()
        return got

    app.broker.receive = first_receives  # type: ignore[method-assign]
    other.broker.receive = second_receives  # type: ignore[method-assign]

    class Ledgered(shardq.Worker):  # the same worker, bound to the second app
        shards = 3
        visibility_timeout = 2
        max_retries = 50

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            for payload in payloads:
                ledger.run_job(entity_id, payload)

    other.register(Ledgered)
    nodes = [
        a.node(a.plan(threads=3), until_empty=True, seed=s) for s, a in enumerate([app, other])
    ]
    runners = [threading.Thread(target=n.run) for n in nodes]
    # when both run at once
    for r in runners:
        r.start()
    for r in runners:
        r.join(90)
    # then both did work, and no entity ever ran twice at once or out of order
    assert all(sum(n.tally().succeeded.values()) > 0 for n in nodes)
    problems = ledger.check(ledger.read(ledger_path), expected)
    assert problems["overlap"] == [] and problems["order"] == [] and problems["lost"] == []


def test_stop_releases_received_jobs_that_did_not_start(app: shardq.App, ledger_path: str) -> None:
    # given a batch of 5 slow jobs of one entity received by a running node
    Ledgered.publish_many([("e", {"n": n, "sleep": 0.5}) for n in range(5)])
    node = app.node(app.plan(threads=1), seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    deadline = time.monotonic() + 30
    while not ledger_started(ledger_path) and time.monotonic() < deadline:
        time.sleep(0.02)
    # when the node is stopped while job 0 runs
    node.stop()
    runner.join(30)
    # then job 0 finished, jobs 1..4 never started and are visible again at once
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [("start", 0), ("end", 0)]
    queue = app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    counts = app.broker.counts(queue)
    assert (counts.waiting, counts.in_flight) == (4, 0)


def ledger_started(path: str) -> bool:
    return Path(path).exists() and Path(path).stat().st_size > 0


class BrokenDeletes(shardq.MemoryBroker):
    """A broker with a bug: delete_batch raises something that is not a BrokerError."""

    def delete_batch(self, queue: str, receipts: Any) -> Any:
        raise RuntimeError("bug in the broker")


def test_a_broker_bug_in_a_background_thread_stops_the_node_with_exit_1_and_loses_nothing(
    ledger_path: str,
) -> None:
    # given a broker whose deletes crash, and one job
    broker = BrokenDeletes()
    ledger.app.configure(Config(grace_seconds=5, idle_wait_seconds=1), broker=broker)
    Ledgered.publish("e", {"n": 0})
    # when a node runs it
    with capture_logs() as logs:
        code = ledger.app.node(ledger.app.plan(threads=1), until_empty=True).run()
    # then the node stops with exit code 1, says why, and the job is still queued
    assert code == 1
    queue = ledger.app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    failed = [(e["part"], e["error"]) for e in logs if e["event"] == "node.part_failed"]
    assert failed and set(failed) == {(f"a request to {queue}", "RuntimeError: bug in the broker")}
    counts = broker.counts(queue)
    assert counts.waiting + counts.in_flight == 1


def test_a_failed_batch_sends_only_the_job_that_fails_alone_to_the_morgue(
    app: shardq.App, ledger_path: str
) -> None:
    # given perform gets 5 jobs of an entity at once, and job 2 of them is broken for good
    app.configure(
        app.config.with_overrides(workers={"Ledgered": {"batch_size": 5}}), broker=app.broker
    )
    Ledgered.publish_many([("e", {"n": n, "permanent": n == 2}) for n in range(5)])
    # when the node runs them
    with capture_logs() as logs:
        run_until_empty(app, threads=1)
    # then the call failed, its jobs ran again one at a time, in order, and only job 2
    # (which failed alone) is in the morgue; the others succeeded, in order
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [
        *[("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("fail", 2)],
        *[("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("fail", 2)],
        *[("start", 3), ("end", 3), ("start", 4), ("end", 4)],
    ]
    assert [(r.entity_id, r.reason) for r in morgue_records(app)] == [("e", "permanent_error")]
    morgued = [e for e in logs if e["event"] == "job.morgued"]
    assert len(morgued) == 1 and morgued[0]["log_level"] == "warning"
    assert sum(1 for e in logs if e["event"] == "job.succeeded") == 4


def test_perform_sees_the_attempt_and_each_job_of_its_call(
    app: shardq.App, ledger_path: str
) -> None:
    # given a worker that notes self.attempt and self.jobs, and fails its first try
    seen: list[tuple[int, list[tuple[str, int, str]]]] = []

    def perform(self: Ledgered, entity_id: str, payloads: list[Any]) -> None:
        seen.append((self.attempt, [(j.message_id, j.attempt, j.meta["k"]) for j in self.jobs]))
        assert all(j.sent_at > 0 for j in self.jobs)
        if len(seen) == 1:
            raise shardq.Retry(delay=0)

    app.configure(
        app.config.with_overrides(workers={"Ledgered": {"batch_size": 2}}), broker=app.broker
    )
    first = Ledgered.publish("e", {"n": 0}, meta={"k": "a"})
    second = Ledgered.publish("e", {"n": 1}, meta={"k": "b"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Ledgered, "perform", perform)
        # when a node runs them
        run_until_empty(app, threads=1)
    # then perform saw attempt 1, then attempt 2, with each job's id, attempt and meta
    assert seen == [
        (1, [(first, 1, "a"), (second, 1, "b")]),
        (2, [(first, 2, "a"), (second, 2, "b")]),
    ]


def test_a_long_retry_hides_the_entitys_later_jobs_with_the_failed_one(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given retries go through the broker (none is held in the node), and job 1 of an
    # entity fails twice with jobs 2..4 queued behind it
    monkeypatch.setattr(shardq.run.executor, "LOCAL_RETRY_SECONDS", -1.0)
    monkeypatch.setattr(Ledgered, "retry_in", lambda self, attempt: 0.3)
    Ledgered.publish_many([("e", {"n": n, "fail": 2 if n == 1 else 0}) for n in range(5)])
    # when the node runs
    with capture_logs() as logs:
        run_until_empty(app)
    # then jobs 2..4 start only after job 1 succeeded, and nothing was released while
    # job 1 was hidden: its later jobs were hidden with it
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [
        *[("start", 0), ("end", 0)],
        *[("start", 1), ("fail", 1)] * 2,
        *[("start", 1), ("end", 1), ("start", 2), ("end", 2)],
        *[("start", 3), ("end", 3), ("start", 4), ("end", 4)],
    ]
    retried = [e for e in logs if e["event"] == "job.retried"]
    assert [e["attempt"] for e in retried] == [1, 2]


class MorgueDownAtFirst:
    """A store's ``put`` that refuses the first two morgue writes (then it recovers)."""

    def __init__(self, store: shardq.store.Store) -> None:
        self.put = store.put
        self.refused = 0

    def __call__(self, key: str, value: Any, *, version: int | None) -> Any:
        if key.startswith("morgue/") and self.refused < 2:
            self.refused += 1
            raise shardq.store.StoreError("the morgue is unreachable")
        return self.put(key, value, version=version)


def test_an_invalid_message_keeps_its_place_even_when_the_morgue_is_unreachable(
    ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an entity whose second message is garbage, behind and before valid jobs,
    # and a morgue that refuses the first writes
    monkeypatch.setattr(shardq.run.executor, "INVALID_RETRY_SECONDS", 0.2)
    broker = shardq.MemoryBroker()
    ledger.app.configure(Config(idle_wait_seconds=1, grace_seconds=5), broker=broker)
    down = MorgueDownAtFirst(ledger.app.store)
    monkeypatch.setattr(ledger.app.store, "put", down)
    ledger.app.ensure_queues()
    queue = ledger.app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    Ledgered.publish("e", {"n": 0})
    broker.send_batch(queue, [SendEntry("0", "not a job", "e", "garbage")])
    Ledgered.publish("e", {"n": 2})
    # when a node runs them
    with capture_logs() as logs:
        run_until_empty(ledger.app, threads=1)
    # then job 2 ran only after the garbage reached the morgue, never before
    events = [(e["event"], e["n"]) for e in ledger.read(ledger_path)]
    assert events == [("start", 0), ("end", 0), ("start", 2), ("end", 2)]
    assert down.refused == 2
    outcomes = [e["event"] for e in logs if e["event"].startswith("job.")]
    assert outcomes.index("job.morgued") < outcomes.index("job.succeeded", 1)
    (record,) = morgue_records(ledger.app)
    assert record.reason == "invalid_message"
    broker.close()


class _CountingCounts(shardq.MemoryBroker):
    """Counts the calls of ``counts`` (one GetQueueAttributes each on SQS)."""

    calls = 0

    def counts(self, queue: str) -> Any:
        self.calls += 1
        return super().counts(queue)


def test_an_until_empty_node_waiting_for_one_busy_shard_asks_about_it_not_every_shard() -> None:
    # given 200 shards, the last one holding a job another consumer holds for 3 s
    broker = _CountingCounts()
    app = shardq.App(Config(queue_prefix="ue-", idle_wait_seconds=1), broker=broker)

    @app.register
    class Many(shardq.Worker):
        shards = 200

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            return None

    node = app.node(app.plan(threads=2), until_empty=True)
    Many.publish(next(e for e in map(str, range(10_000)) if shard_for(e, 200) == 199), {})
    broker.receive(
        app.shard_queue("Many", 199), max_messages=1, wait_seconds=0, visibility_timeout=3
    )
    # when the node runs until every shard is empty
    runner = threading.Thread(target=node.run)
    runner.start()
    runner.join(30)
    # then it ran the job once it was visible again, and while it waited it asked about
    # the busy shard, not all 200 shards again every half second
    assert not runner.is_alive()
    assert sum(node.tally().succeeded.values()) == 1
    assert broker.calls < 3 * 200, broker.calls


class _Uncountable(shardq.MemoryBroker):
    """Cannot count its queues while ``broken`` (GetQueueAttributes denied, say)."""

    broken = True

    def counts(self, queue: str) -> Any:
        if self.broken:
            raise shardq.BrokerError(f"access denied counting {queue}")
        return super().counts(queue)


def test_an_until_empty_node_says_why_it_cannot_tell_it_is_empty_and_asks_again_later() -> None:
    # given an empty shard on a broker that cannot count it, and a clock the test moves
    clock, broker = ManualClock(), _Uncountable()
    app = shardq.App(Config(queue_prefix="uc-"), broker=broker)

    @app.register
    class Idle(shardq.Worker):
        shards = 1

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            return None

    node = app.node(app.plan(threads=1), until_empty=True, clock=clock)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(node.run()))
    with capture_logs() as logs:
        # when an until-empty node runs, and a second more once it asked, while the clock
        # stands still
        runner.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            e["event"] == "node.counts_failed" for e in logs
        ):
            time.sleep(0.02)
        runner.join(1.0)
        alive = runner.is_alive()
        failed = [e for e in logs if e["event"] == "node.counts_failed"]
        # and the broker can count again, and the clock passes the wait
        broker.broken = False
        clock.advance(COUNTS_RETRY_SECONDS)
        runner.join(10)
    # then it said why it could not stop, once (not every half second), and stopped later
    assert alive
    assert [(e["queue"], e["error"]) for e in failed] == [
        ("uc-idle-0.fifo", "access denied counting uc-idle-0.fifo")
    ]
    assert not runner.is_alive() and result == [0]
    assert [e["event"] for e in logs].count("node.drained") == 1
