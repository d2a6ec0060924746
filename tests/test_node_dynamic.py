"""A node whose shards change while it runs: add, drop, and hand a shard to another node."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq import morgue
from shardq.broker.base import Message
from shardq.core.config import Config
from shardq.core.errors import ConfigError
from shardq.core.plan import Plan, ShardRef
from shardq.core.topology import shard_for
from shardq.ops.ensure import ensure_state_table
from shardq.run.node import Node
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker

EMPTY = Plan(node=0, nodes=1, threads=())


@pytest.fixture
def ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "ledger.jsonl")
    ledger.reset()
    monkeypatch.setenv("LEDGER_PATH", path)
    return path


@pytest.fixture(params=["sqlite", "sqlite-reopen", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(request: pytest.FixtureRequest, tmp_path: Path, ledger_path: str) -> Iterator[shardq.App]:
    """The ledger app (3 shards, 2 s visibility timeout) on the embedded broker, on the
    same engine with a FIFO defect some SQS emulators have (a message group reopens when
    a later message is released while an earlier one is hidden), and on the emulator."""
    broker = make_broker(request.param, tmp_path, request)
    prefix = f"d{time.monotonic_ns() % 10**9}-"
    ledger.app.configure(
        Config(queue_prefix=prefix, grace_seconds=10, idle_wait_seconds=1), broker=broker
    )
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield ledger.app
    broker.close()


def visibility(app: shardq.App, seconds: int) -> None:
    app.configure(
        app.config.with_overrides(workers={"Ledgered": {"visibility_timeout": seconds}}),
        broker=app.broker,
    )
    ensure_state_table(app)  # DynamoDB's table, as `shardq queues ensure` makes it


def ref(shard: int, app: shardq.App | None = None) -> ShardRef:
    settings = (app or ledger.app).settings("Ledgered")
    return ShardRef("Ledgered", shard, settings.priority)


def entities_of(shard: int, count: int, prefix: str = "e") -> list[str]:
    names = (f"{prefix}{i}" for i in range(10_000))
    return [name for name in names if shard_for(name, 3) == shard][:count]


def start(node: Node) -> threading.Thread:
    runner = threading.Thread(target=node.run, daemon=True)
    runner.start()
    return runner


def stop(node: Node, runner: threading.Thread) -> None:
    node.stop()
    runner.join(30)
    assert not runner.is_alive(), "the node did not stop"


def wait_for(check: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.02)


def ended(path: str) -> set[tuple[str, int]]:
    if not Path(path).exists():
        return set()
    return {(e["entity"], e["n"]) for e in ledger.read(path) if e["event"] == "end"}


def held_of(node: Node, queue: str) -> list[Message]:
    return [m for m in node.leases.held() if m.queue == queue]


def receive_all(app: shardq.App, queue: str) -> list[tuple[str, int]]:
    """Every job a plain consumer can receive from ``queue`` now (each is deleted)."""
    jobs: list[tuple[str, int]] = []
    while batch := app.broker.receive(
        queue, max_messages=10, wait_seconds=0, visibility_timeout=60
    ):
        jobs += [(m.group_id, shardq.core.envelope.decode(m.body).payload["n"]) for m in batch]
        app.broker.delete_batch(queue, [m.receipt for m in batch])
    return jobs


def test_a_dropped_shard_is_handed_back_whole_once_its_event_is_set(
    app: shardq.App, ledger_path: str
) -> None:
    # given a node serving every shard, with jobs of 40 entities of shard 0 (several
    # batches in hand at once) and of shard 1 flowing, and a visibility timeout far
    # longer than the test
    visibility(app, 60)
    mine, other = entities_of(0, 40), entities_of(1, 8)
    Ledgered.publish_many([(e, {"n": n, "sleep": 0.002}) for n in range(8) for e in mine + other])
    node = app.node(app.plan(threads=2), seed=3)
    runner = start(node)
    wait_for(lambda: len({j for j in ended(ledger_path) if j[0] in mine}) >= 30)
    # when shard 0 is dropped
    done = node.drop_shard(ref(0))
    assert done.wait(60), "the drop did not finish"
    dropped_at = time.time()
    # then the node serves it no more and holds nothing of it
    queue = app.shard_queue("Ledgered", 0)
    assert ref(0) not in node.shard_refs() and len(node.shard_refs()) == 2
    assert held_of(node, queue) == []
    # and every job of it that did not run is receivable at once, none lost, none twice
    left = receive_all(app, queue)
    ran = {j for j in ended(ledger_path) if j[0] in mine}
    assert len(left) == len(set(left))
    assert ran.isdisjoint(left)
    assert ran | set(left) == {(e, n) for e in mine for n in range(8)}
    assert len(left) > 0
    # and no job of it started after the drop, while the other shards were served on
    late = [e for e in ledger.read(ledger_path) if e["entity"] in mine and e["t"] > dropped_at]
    assert late == []
    wait_for(lambda: {(e, n) for e in other for n in range(8)} <= ended(ledger_path))
    stop(node, runner)


def test_a_shard_handed_between_two_nodes_keeps_every_entity_in_order_and_never_overlaps(
    app: shardq.App,
    ledger_path: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given retries that are held by the lane (0.05 s) or hidden at the broker (0.6 s),
    # about 10 % of attempts failing and some jobs broken for good
    monkeypatch.setattr(shardq.run.executor, "LOCAL_RETRY_SECONDS", 0.3)

    def retry_in(self: Any, attempt: int) -> float:
        return random.choice([0.05, 0.6])

    monkeypatch.setattr(Ledgered, "retry_in", retry_in)
    kind = "sqlite-reopen" if getattr(app.broker, "reopen_groups", False) else app.broker.kind
    other = second_app(app, make_broker(kind, tmp_path, request), retry_in)
    entities, jobs = [f"x{i}" for i in range(90)], 8  # 30 per shard: several batches
    broken = {(e, 5) for e in entities[:6]}
    # and node A serving every shard, node B (elastic) serving none, both running
    a = app.node(app.plan(threads=2), seed=1)
    b = other.node(EMPTY, threads=2, seed=2)
    runners = [start(a), start(b)]

    def publish() -> None:  # jobs keep coming in rounds while shards change hands
        for n in range(jobs):
            Ledgered.publish_many(
                [(e, {"n": n, "fail_rate": 0.1, "permanent": (e, n) in broken}) for e in entities]
            )
            time.sleep(0.1)

    publisher = threading.Thread(target=publish)
    publisher.start()
    # when shards 0 and 1 go from A to B, then shard 0 back to A, each added by the
    # other node right after the drop's event is set
    for shard, giver, taker in [(0, a, b), (1, a, b), (0, b, a)]:
        count = len(ended(ledger_path))
        wait_for(lambda c=count: len(ended(ledger_path)) >= c + 40)
        assert giver.drop_shard(ref(shard)).wait(60)
        taker.add_shard(ref(shard, taker.app))
    publisher.join()
    everything = {(e, n) for e in entities for n in range(jobs)}
    wait_for(lambda: everything - broken <= ended(ledger_path), timeout=60, what="every job")
    for node, runner in zip([a, b], runners, strict=True):
        stop(node, runner)
    # then each node served what it was given and worked on it
    assert sorted(r.shard for r in a.shard_refs()) == [0, 2]
    assert [r.shard for r in b.shard_refs()] == [1]
    assert sum(b.tally().succeeded.values()) > 0
    assert sum(a.tally().retried.values()) + sum(b.tally().retried.values()) > 0
    # and every job succeeded once, in publish order per entity, never two at once,
    # except the broken ones, which are in the morgue, each once
    problems = ledger.check(ledger.read(ledger_path), {e: jobs for e in entities}, broken)
    assert problems == {
        "lost": [],
        "order": [],
        "overlap": [],
        "duplicates": [],
        "bad_duplicates": [],
    }
    assert ended(ledger_path).isdisjoint(broken)
    records = morgue_records(app)
    assert sorted((r.entity_id, r.reason) for r in records) == sorted(
        (e, "permanent_error") for e, _ in broken
    )
    other.broker.close()


def second_app(app: shardq.App, broker: shardq.broker.Broker, retry: Any) -> shardq.App:
    """The ledger app again, on its own broker connection (another node's)."""
    other = shardq.App(app.config, broker=broker, store=app.store)  # one shared store

    @other.register
    class Ledgered(shardq.Worker):
        shards = 3
        visibility_timeout = 2
        max_retries = 50
        retry_in = retry

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            for payload in payloads:
                ledger.run_job(entity_id, payload)

    return other


def morgue_records(app: shardq.App) -> list[morgue.MorgueRecord]:
    return morgue.Morgue(app, "Ledgered").page(limit=100_000).records


def test_a_drop_waits_for_the_running_job_of_the_shard(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job that runs until the test lets it end, and a job behind it
    visibility(app, 60)
    gate = threading.Event()

    def perform(self: Ledgered, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for p in payloads:
            if p.get("gate"):
                ledger.record("start", entity_id, p["n"])
                gate.wait(20)
                ledger.record("end", entity_id, p["n"])
            else:
                ledger.run_job(entity_id, p)

    monkeypatch.setattr(Ledgered, "perform", perform)
    (entity,) = entities_of(0, 1)
    Ledgered.publish_many([(entity, {"n": 0, "gate": True}), (entity, {"n": 1})])
    node = app.node(app.plan(threads=1), seed=1)
    runner = start(node)
    wait_for(lambda: Path(ledger_path).exists(), what="the job to start")
    # when its shard is dropped while the job runs
    done = node.drop_shard(ref(0))
    # then the drop is not done while the job runs, and the node still holds it
    queue = app.shard_queue("Ledgered", 0)
    assert not done.wait(0.5)
    assert held_of(node, queue) != []
    # and once the job ends, the drop finishes: nothing is held, the job is deleted,
    # and what did not run is receivable (on SQS, once the shard's idle watch released
    # what its long poll in flight at the drop received: well within the 60 s
    # visibility a job held by mistake would stay hidden)
    gate.set()
    assert done.wait(60)
    # (a long poll in flight at the drop may take job 1 once released: handed back at once)
    wait_for(lambda: held_of(node, queue) == [], timeout=10, what="nothing held of the shard")
    both, left = {(entity, 0), (entity, 1)}, receive_all(app, queue)
    deadline = time.monotonic() + 30
    while ended(ledger_path) | set(left) != both and time.monotonic() < deadline:
        time.sleep(0.1)
        left += receive_all(app, queue)
    assert (entity, 0) in ended(ledger_path)
    assert ended(ledger_path) | set(left) == both
    assert ended(ledger_path).isdisjoint(left)
    stop(node, runner)


def test_a_drop_is_done_without_a_stuck_job_which_keeps_its_entity_until_it_ends(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job that runs until the test lets it end (past the 1 s grace period a
    # handover waits for running jobs), and a job of its entity behind it
    visibility(app, 60)
    app.configure(app.config.with_overrides(grace_seconds=1), broker=app.broker)
    gate = threading.Event()

    def perform(self: Ledgered, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for p in payloads:
            if p.get("gate"):
                ledger.record("start", entity_id, p["n"])
                gate.wait(60)
            ledger.run_job(entity_id, p)

    monkeypatch.setattr(Ledgered, "perform", perform)
    entity, other = entities_of(0, 2)
    Ledgered.publish_many([(entity, {"n": 0, "gate": True}), (entity, {"n": 1})])
    node = app.node(app.plan(threads=1), seed=1)
    runner = start(node)
    wait_for(lambda: Path(ledger_path).exists(), what="the job to start")
    # when its shard is dropped, and a job of another entity of the shard is published
    done = node.drop_shard(ref(0))
    Ledgered.publish(other, {"n": 2})
    # then the drop is done while the job runs; the node holds only its entity's jobs
    assert done.wait(30), "the drop waited for the stuck job"
    queue = app.shard_queue("Ledgered", 0)
    assert {m.group_id for m in held_of(node, queue)} == {entity}
    # and another consumer gets the other entity's job, not the stuck entity's later one
    left: list[tuple[str, int]] = []
    wait_for(lambda: bool(left.extend(receive_all(app, queue))) or left != [], timeout=30)
    assert left == [(other, 2)]
    # and once the job ends, the node deletes it and releases its entity's later job
    gate.set()
    wait_for(lambda: held_of(node, queue) == [], timeout=30, what="nothing held of the shard")
    wait_for(lambda: bool(left.extend(receive_all(app, queue))) or len(left) > 1, timeout=30)
    assert left == [(other, 2), (entity, 1)]
    assert ended(ledger_path) == {(entity, 0)}
    stop(node, runner)


def test_a_drop_hides_a_held_retry_for_what_is_left_of_its_delay(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given job 0 of an entity fails once and its retry, due in 2 s, is held by the lane
    # with job 1 behind it (the visibility timeout is far longer)
    visibility(app, 60)
    monkeypatch.setattr(Ledgered, "retry_in", lambda self, attempt: 2.0)
    (entity,) = entities_of(0, 1)
    Ledgered.publish_many([(entity, {"n": 0, "fail": 1}), (entity, {"n": 1})])
    node = app.node(app.plan(threads=1), seed=1)
    runner = start(node)
    wait_for(lambda: Path(ledger_path).exists() and len(ledger.read(ledger_path)) >= 2)
    (fail,) = [e for e in ledger.read(ledger_path) if e["event"] == "fail"]
    # when its shard is dropped
    done = node.drop_shard(ref(0))
    assert done.wait(60)
    # then the node holds nothing of it, and neither job is visible before the retry
    # is due; then both are, in order, and neither ran again here
    queue = app.shard_queue("Ledgered", 0)
    assert held_of(node, queue) == []
    due = fail["t"] + 2.0
    seen: list[tuple[str, int]] = []
    while not seen and time.time() < due + 5:
        early = time.time() < due
        seen = receive_all(app, queue)
        assert not (seen and early), "the retry was released before it was due"
        time.sleep(0.05)
    assert seen == [(entity, 0), (entity, 1)]
    assert [e["event"] for e in ledger.read(ledger_path)] == ["start", "fail"]
    stop(node, runner)


def test_an_elastic_node_serves_shards_added_dropped_and_added_again(
    app: shardq.App, ledger_path: str
) -> None:
    # given a running node with an empty plan and 2 lanes
    node = app.node(EMPTY, threads=2, seed=1)
    runner = start(node)
    assert node.shard_refs() == []
    # when shards 0 and 1 are added
    node.add_shard(ref(0))
    node.add_shard(ref(1))
    node.add_shard(ref(0))  # already served: nothing changes
    # then each goes to a lane of its own and their jobs run
    assert node.shard_refs() == [ref(0), ref(1)]
    wait_for(lambda: [len(lane.shards) for lane in node.lanes] == [1, 1])
    zero, one = entities_of(0, 3), entities_of(1, 3)
    Ledgered.publish_many([(e, {"n": n}) for n in range(3) for e in zero + one])
    wait_for(lambda: len(ended(ledger_path)) == 18)
    # when shard 0 is dropped, jobs arrive for it, and it is added again
    assert node.drop_shard(ref(0)).wait(60)
    assert node.shard_refs() == [ref(1)]
    wait_for(lambda: [len(lane.shards) for lane in node.lanes] == [0, 1])
    Ledgered.publish_many([(e, {"n": n}) for n in range(3, 5) for e in zero + one])
    wait_for(lambda: len(ended(ledger_path)) == 24)  # shard 1's
    assert not any(e in zero for e, n in ended(ledger_path) if n >= 3)
    node.add_shard(ref(0))
    # then it is served again, on the lane with the fewest shards
    wait_for(lambda: len(ended(ledger_path)) == 30)
    assert [len(lane.shards) for lane in node.lanes] == [1, 1]
    # and dropping a shard it does not serve is done at once
    assert node.drop_shard(ref(2)).is_set()
    stop(node, runner)
    problems = ledger.check(ledger.read(ledger_path), dict.fromkeys(zero + one, 5))
    assert problems["lost"] == problems["order"] == problems["duplicates"] == []


def test_a_shard_with_nothing_in_flight_is_handed_back_without_a_thread_of_its_own(
    app: shardq.App, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a running node serving shard 0, whose jobs all ran and were deleted
    node = app.node(EMPTY, threads=1, seed=1)
    runner = start(node)
    node.add_shard(ref(0))
    Ledgered.publish_many([(e, {"n": 0}) for e in entities_of(0, 3)])
    wait_for(lambda: len(ended(ledger_path)) == 3 and not node.intake.leases.held())
    started: list[str] = []
    threads_start = node.threads.start

    def noted(name: str, what: str, run: Any) -> threading.Thread:
        started.append(name)
        return threads_start(name, what, run)

    monkeypatch.setattr(node.threads, "start", noted)
    # when it is dropped (as a fence drops every shard of a node at once)
    done = node.drop_shard(ref(0))
    # then its handover is done without starting a thread for it
    assert done.wait(30) and not [n for n in started if n.startswith("shardq-drop")]
    stop(node, runner)


def test_a_shard_added_before_the_node_runs_is_served_from_the_start(
    app: shardq.App, ledger_path: str
) -> None:
    # given an elastic node, given shard 2 before it runs, and jobs of shard 2
    node = app.node(EMPTY, threads=2, seed=1)
    node.add_shard(ref(2))
    assert node.shard_refs() == [ref(2)]
    assert [len(lane.shards) for lane in node.lanes] == [1, 0]
    entities = entities_of(2, 4)
    Ledgered.publish_many([(e, {"n": 0}) for e in entities])
    # when it runs
    runner = start(node)
    # then it runs them
    wait_for(lambda: len(ended(ledger_path)) == 4)
    stop(node, runner)


def test_a_drop_while_the_node_stops_is_done_when_the_shutdown_is(
    app: shardq.App, ledger_path: str
) -> None:
    # given a node that is stopping with a job of shard 0 running (jobs hidden 60 s per
    # receive, so one held by mistake stays hidden past the wait below)
    visibility(app, 60)
    (entity,) = entities_of(0, 1)
    Ledgered.publish_many([(entity, {"n": 0, "sleep": 0.5}), (entity, {"n": 1})])
    node = app.node(app.plan(threads=1), seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    wait_for(lambda: Path(ledger_path).exists(), what="the job to start")
    node.stop()
    # when shard 0 is dropped
    done = node.drop_shard(ref(0))
    # then the drop is done once the node stopped, and a later drop at once
    runner.join(30)
    assert done.wait(30)
    assert node.drop_shard(ref(1)).is_set()
    # and job 1 waits, visible (on SQS, once a long poll the stopped node abandoned
    # released what it received)
    queue = app.shard_queue("Ledgered", 0)
    deadline = time.monotonic() + 30
    while (counts := app.broker.counts(queue)).in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (counts.waiting, counts.in_flight) == (1, 0)


def test_an_elastic_node_extends_leases_often_enough_for_every_worker(app: shardq.App) -> None:
    # given the ledger worker's 2 s visibility timeout
    # when an elastic node starts with no shard, or a static node with an empty plan
    elastic, static = app.node(EMPTY, threads=1), app.node(EMPTY)
    # then the elastic one looks for extensions due every third of a second
    assert elastic.leases._interval == pytest.approx(2 / 6)
    assert static.leases._interval == 1.0


def test_bad_shard_refs_and_thread_counts_are_refused(app: shardq.App) -> None:
    node = app.node(EMPTY, threads=1)
    with pytest.raises(ConfigError, match="has 3 shards"):
        node.add_shard(ShardRef("Ledgered", 3, ref(0).priority))
    with pytest.raises(ConfigError, match="priority"):
        node.add_shard(ShardRef("Ledgered", 0, ref(0).priority + 1))
    with pytest.raises(shardq.core.errors.UnknownWorkerError):
        node.add_shard(ShardRef("Nobody", 0, 1))
    assert node.shard_refs() == []
    with pytest.raises(ConfigError, match=r"one per thread of its plan \(3\)"):
        app.node(app.plan(threads=3), threads=2)


class GatedReceives(shardq.MemoryBroker):
    """A broker whose receives from one queue wait until the test opens a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: str | None = None
        self.entered = threading.Event()
        self.gate = threading.Event()

    def receive(self, queue: str, **kwargs: Any) -> list[Message]:
        if queue == self.queue:
            self.entered.set()
            self.gate.wait(10)
        return super().receive(queue, **kwargs)


def test_a_receive_in_flight_at_the_drop_is_released_before_the_drop_is_done(
    ledger_path: str,
) -> None:
    # given a running node whose receive of a job of shard 0 is in flight
    broker = GatedReceives()
    ledger.app.configure(Config(grace_seconds=5, idle_wait_seconds=1), broker=broker)
    visibility(ledger.app, 60)
    node = ledger.app.node(ledger.app.plan(threads=1), seed=1)
    runner = start(node)
    queue = ledger.app.shard_queue("Ledgered", 0)
    broker.queue = queue
    (entity,) = entities_of(0, 1)
    Ledgered.publish(entity, {"n": 0})
    assert broker.entered.wait(60)
    # when shard 0 is dropped, then the receive returns the job
    done = node.drop_shard(ref(0))
    assert not done.wait(0.3), "the drop was done while a receive of it was in flight"
    broker.gate.set()
    # then the drop is done once the job was released: it never ran here, the node
    # holds nothing of it, and it is receivable at once
    assert done.wait(60)
    assert held_of(node, queue) == []
    assert receive_all(ledger.app, queue) == [(entity, 0)]
    assert ended(ledger_path) == set()
    stop(node, runner)
    broker.close()
