"""The elastic fleet on the state store: heartbeats, ownership items, takeover, balance."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq import App, Worker
from shardq.core.config import Config
from shardq.core.fleet_rules import ELASTIC, timing
from shardq.core.heartbeat import Heartbeat
from shardq.core.plan import Plan, ShardRef
from shardq.core.topology import shard_for
from shardq.fleet import Fleet
from shardq.fleet.others import fit, mark_gone
from shardq.ops.ensure import ensure_state_table
from shardq.ops.fleet_view import fleet_view, nodes_text, read_fleet
from shardq.run.node import Node
from shardq.store import Item, MemoryStore, StoreError
from tests.apps import ledger
from tests.clocks import Skipping
from tests.conftest import make_broker

LEASE = 10.0
ALL = {f"Ledgered:{n}" for n in range(6)}


@pytest.fixture
def lease() -> float:
    """The fleet's lease, in seconds (a test may parametrize another)."""
    return LEASE


# The fleet lives in the state store, not in messages: a broker that hides visible-again
# messages ("sqlite-stale") changes nothing here; test_chaos runs the elastic fleet on it.
@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(
    request: pytest.FixtureRequest, tmp_path: Path, ledger_path: str, lease: float
) -> Iterator[App]:
    """The ledger app with 6 shards and ``lease`` (10 s unless a test says otherwise)."""
    broker = make_broker(request.param, tmp_path, request)
    config = Config(
        queue_prefix=f"f{time.monotonic_ns() % 10**9}-",
        grace_seconds=10,
        idle_wait_seconds=1,
        lease_seconds=lease,
        workers={"Ledgered": {"shards": 6}},
    )
    ledger.app.configure(config, broker=broker)
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield ledger.app
    broker.close()


@pytest.fixture
def ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "ledger.jsonl")
    ledger.reset()
    monkeypatch.setenv("LEDGER_PATH", path)
    return path


class Running:
    """Elastic nodes run in threads of this process, on one clock the test moves;
    stopped at the end of a test."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.clock = Skipping()
        self.nodes: list[tuple[Node, threading.Thread]] = []

    def start(self) -> Node:
        node = self.app.node(Plan(0, 0, ()), threads=2, membership=ELASTIC, clock=self.clock)
        runner = threading.Thread(target=node.run, daemon=True)
        runner.start()
        self.nodes.append((node, runner))
        return node

    def stop(self, node: Node) -> None:
        for n, runner in self.nodes:
            if n is node:
                n.stop()
                runner.join(30)
                assert not runner.is_alive(), "the node did not stop"

    def stop_all(self) -> None:
        for node, _ in self.nodes:
            self.stop(node)


@pytest.fixture
def running(app: App) -> Iterator[Running]:
    fleet = Running(app)
    yield fleet
    fleet.stop_all()


def keys(node: Node) -> set[str]:
    return {r.key for r in node.shard_refs()}


def owners(app: App) -> dict[str, str]:
    items = app.store.query_all("shard/")
    return {i.key.partition("/")[2]: str(i.value["owner"]) for i in items if i.value["owner"]}


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_lone_node_takes_every_shard_and_the_store_says_so(app: App, running: Running) -> None:
    # when one elastic node runs
    node = running.start()
    # then it serves every shard, owns every ownership item and keeps one heartbeat
    wait_for(lambda: keys(node) == ALL, 60, "every shard")
    assert owners(app) == {k: node.id for k in ALL}
    beat = app.store.get(f"node/{node.id}")
    assert beat is not None and beat.value["mode"] == ELASTIC
    wait_for(lambda: set(app.store.get(f"node/{node.id}").value["held"]) == ALL, 10, "report")  # type: ignore[union-attr]


def test_a_joining_node_gets_its_share_and_a_stopping_one_hands_back_at_once(
    app: App, running: Running
) -> None:
    # given a node holding every shard
    first = running.start()
    wait_for(lambda: keys(first) == ALL, 60, "every shard on the first node")
    # when a second node joins
    second = running.start()
    # then within two lease periods each serves half, and no shard is served twice
    wait_for(lambda: len(keys(second)) == 3 and len(keys(first)) == 3, 2 * LEASE, "a fair share")
    assert keys(first) | keys(second) == ALL and not keys(first) & keys(second)
    wait_for(lambda: sorted(owners(app).values()).count(second.id) == 3, 30, "owners")
    # when the first stops gracefully
    running.stop(first)
    # then its heartbeat is gone and the second serves every shard within a few rounds,
    # sooner than a dead node's shards could be taken (its counter still for the expiry)
    assert app.store.get(f"node/{first.id}") is None
    wait_for(lambda: keys(second) == ALL, timing(LEASE)[1], "the handed-back shards")
    assert owners(app) == {k: second.id for k in ALL}


def test_a_stuck_job_holds_only_its_entity_while_its_shard_moves_to_a_joining_node(
    app: App, running: Running, ledger_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node holding every shard and running in each a job that does not end until
    # the test lets it (past the 1 s grace period a handover waits for running jobs), with
    # a later job of its entity behind it
    app.configure(app.config.with_overrides(grace_seconds=1), broker=app.broker)
    gate = threading.Event()

    def perform(self: ledger.Ledgered, entity_id: str, payloads: list[dict[str, object]]) -> None:
        for payload in payloads:
            if payload.get("gate"):
                ledger.record("stuck", entity_id, 0)
                gate.wait(60)
            ledger.run_job(entity_id, payload)

    monkeypatch.setattr(ledger.Ledgered, "perform", perform)
    names = [f"s{i}" for i in range(200)]
    stuck = {shard_for(e, 6): e for e in reversed(names)}
    free = {shard_for(e, 6): e for e in names if e not in stuck.values()}
    first = running.start()
    wait_for(lambda: keys(first) == ALL, 60, "every shard on the first node")
    ledger.Ledgered.publish_many(
        [(e, {"n": n, "gate": n == 0}) for e in stuck.values() for n in (0, 1)]
    )

    def events(kind: str) -> set[tuple[str, int]]:
        if not Path(ledger_path).exists():
            return set()
        return {(e["entity"], e["n"]) for e in ledger.read(ledger_path) if e["event"] == kind}

    wait_for(lambda: len(events("stuck")) == 6, 30, "the six jobs to start")
    # when a second node joins
    second = running.start()
    # then within two lease periods each serves half, though the jobs still run
    wait_for(lambda: len(keys(second)) == 3 and len(keys(first)) == 3, 2 * LEASE, "a fair share")
    # and the second runs the other entities' jobs of the shards it took, while the
    # stuck entities' later jobs wait behind them
    moved = [free[int(k.rpartition(":")[2])] for k in keys(second)]
    ledger.Ledgered.publish_many([(e, {"n": 0}) for e in moved])
    wait_for(lambda: {(e, 0) for e in moved} <= events("end"), 30, "the other entities' jobs")
    assert not {e for e, _ in events("start")} & set(stuck.values())
    # and once the jobs end, each stuck entity's jobs run once each, in order, never two
    # at once
    gate.set()
    wait_for(lambda: {(e, n) for e in stuck.values() for n in (0, 1)} <= events("end"), 60, "all")
    for entity in stuck.values():
        seen = [(e["event"], e["n"]) for e in ledger.read(ledger_path) if e["entity"] == entity]
        assert seen == [("stuck", 0), ("start", 0), ("end", 0), ("start", 1), ("end", 1)]


@pytest.mark.parametrize("lease", [60.0])
def test_a_frozen_node_has_its_shards_taken_within_the_lease_and_is_marked_gone(
    app: App, running: Running, lease: float
) -> None:
    # given two nodes sharing the shards, with leases too long to expire in real time
    # while the test runs
    first, second = running.start(), running.start()
    wait_for(lambda: len(keys(first)) == 3 and len(keys(second)) == 3, 3 * LEASE, "a fair share")
    # when the first's membership freezes as if its process were killed (no beat, no
    # release; its lanes go on, as a killed node's in-flight jobs would reappear)
    assert first.fleet is not None and first.fleet._thread is not None
    first.fleet._stop.set()
    first.fleet._thread.join(10)

    # and lease periods pass on the nodes' clock (a quarter at each look: the second may
    # see the first's last beat only after a jump, so one jump alone may not be enough)
    def a_quarter_lease_later() -> bool:
        running.clock.offset += lease / 4
        return keys(second) == ALL

    # then the second holds every shard within a few rounds (the nodes' clock decides)
    wait_for(a_quarter_lease_later, 30, "the takeover")
    assert owners(app) == {k: second.id for k in ALL}
    beat = app.store.get(f"node/{first.id}")
    assert beat is not None and beat.value["gone"] == "lease expired"
    assert beat.value["by"] == second.id and beat.value["node"] == first.id  # kept its report
    view = fleet_view(read_fleet(app.store), time.time(), {"Ledgered": 6})
    assert [n.node for n in view.nodes] == [second.id] and not view.unserved
    assert [g.report.node for g in view.gone] == [first.id]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stepped(app: App, clock: Clock, name: str) -> Fleet:
    node = app.node(Plan(0, 0, ()), threads=2, membership=None)
    return Fleet(node, elastic=True, node_id=name, clock=clock)


@contextmanager
def unreachable(app: App) -> Iterator[None]:
    """Every write to the state store fails while inside."""
    original = app.store.put

    def failing(*args: object, **kwargs: object) -> object:
        raise StoreError("the store is unreachable")

    app.store.put = failing  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        app.store.put = original  # type: ignore[method-assign]


def fenced_owner_and_watcher(app: App, clock: Clock) -> tuple[Fleet, Fleet]:
    """Node a owning every shard but fenced (serving none), and node b watching it."""
    a = stepped(app, clock, "a")
    a._beat(clock())
    a.step()
    b = stepped(app, clock, "b")
    b._beat(clock())
    b.step()
    a._fence()
    return a, b


def balanced_pair(app: App, clock: Clock) -> tuple[Fleet, Fleet]:
    """Nodes a and b stepped by hand on ``clock`` until they share the shards."""
    a, b = stepped(app, clock, "a"), stepped(app, clock, "b")
    for _ in range(4):
        a.step(), b.step()
        clock.now += 1.0
    return a, b


def test_a_dead_nodes_shards_are_taken_exactly_when_its_counter_stood_still_long_enough(
    app: App,
) -> None:
    # given two fleets stepped by hand on one clock, balanced (a took 3 shards b freed)
    clock = Clock()
    with capture_logs() as logs:  # one capture: the fleet's logger is cached at first use
        a, b = balanced_pair(app, clock)
        assert len(a.held()) == 3 and len(b.held()) == 3
        balancing, held_before = len(logs), set(a.held())
        # when b stops beating (killed) and a keeps stepping
        _, expire = timing(LEASE)
        dead_at = clock.now + expire
        while clock.now < dead_at - 1.0:
            a.step()
            clock.now += 1.0
            # then nothing is taken before b's counter stood still for the expiry
            assert len(a.held()) == 3
        clock.now = dead_at + 1.0
        a.step()  # marks b gone
        a.step()  # takes its shards
    assert a.held() == sorted(ALL)
    assert owners(app) == {k: "a" for k in ALL}
    # and it said it took each of b's over, not the shards b freed for it at the balance
    took_over = {e["shard"]: e["previous"] for e in logs if e["event"] == "fleet.took_over"}
    assert took_over == {k: "b" for k in ALL - held_before}
    assert not [e for e in logs[:balancing] if e["event"] == "fleet.took_over"]


def test_a_node_that_beat_during_its_observer_s_long_round_is_not_counted_dead(
    app: App,
) -> None:
    # given two nodes sharing the shards, stepped by hand on one clock
    clock = Clock()
    a, b = balanced_pair(app, clock)
    # when b's round spends 5 s before it reads the heartbeats (freeing shards), a beating
    # 4 s into it, and b's next round reads them 1 s after that read
    settle = b._settle_drains

    def slow() -> None:
        clock.now += 4.0
        a.step()
        clock.now += 1.0
        settle()

    b._settle_drains = slow  # type: ignore[method-assign]
    b.step()
    b._settle_drains = settle  # type: ignore[method-assign]
    clock.now += 1.0
    b.step()
    # then a, whose last beat b read 1 s before, is live: not marked gone
    beat = app.store.get("node/a")
    assert beat is not None and not beat.value.get("gone")
    assert set(a.held()) and set(a.held()) | set(b.held()) == ALL


def test_a_node_that_beat_during_its_observer_s_slow_read_is_not_counted_dead(
    app: App,
) -> None:
    # given two nodes sharing the shards, stepped by hand on one clock
    clock = Clock()
    a, b = balanced_pair(app, clock)
    # when b's read of the heartbeats takes 3 s and shows a beat of a's made 2.5 s into
    # it, and b reads them again 3.5 s after that read answered
    query, inside = app.store.query_all, [False]

    def slow(prefix: str, **kwargs: Any) -> list[Item]:
        if prefix == "node/" and not inside[0]:
            inside[0] = True
            clock.now += 2.5
            a.step()
            clock.now += 0.5
            inside[0] = False
        return query(prefix, **kwargs)

    app.store.query_all = slow  # type: ignore[method-assign]
    b.step()
    app.store.query_all = query  # type: ignore[method-assign]
    clock.now += 3.5
    b.step()
    # then a, silent for 4 s at most (its beat came after that read was asked), is live
    beat = app.store.get("node/a")
    assert beat is not None and not beat.value.get("gone")
    assert set(a.held()) and set(a.held()) | set(b.held()) == ALL


def test_the_heartbeat_keeps_the_keys_and_types_every_version_reads(app: App) -> None:
    # given a node holding every shard that counted jobs of its worker
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    for kind, n in (("succeeded", 5), ("retried", 1), ("morgued", 2)):
        a.node.metrics.tally.add(kind, "Ledgered", n)
    # when it beats
    clock.now += timing(LEASE)[0]
    a.step()
    # then its item has the keys and types a node of the previous version wrote and reads
    item = app.store.get("node/a")
    assert item is not None
    value = item.value
    assert {k: type(v) for k, v in value.items()} == {
        **dict.fromkeys(("node", "host", "mode", "version", "prefix"), str),
        **dict.fromkeys(("pid", "threads", "done", "retried", "failed"), int),
        **dict.fromkeys(("concurrency", "slots_in_use"), int),
        **dict.fromkeys(("started", "at", "jobs_per_second", "expire"), float),
        **dict.fromkeys(("lags", "by_worker"), dict),
        "held": list,
    }
    assert value["held"] == sorted(ALL) and value["node"] == "a"
    assert (value["done"], value["retried"], value["failed"]) == (7, 1, 2)
    assert value["by_worker"] == {"Ledgered": {"done": 7, "retried": 1, "failed": 2}}
    # and it reads back as the report it was written from
    assert Heartbeat.from_value("a", value).to_value() == value


def test_a_node_declared_gone_gives_up_its_shards_and_rejoins(app: App) -> None:
    # given a holds every shard, and b marked it gone while it was stalled
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    assert a.held() == sorted(ALL)
    item = app.store.get("node/a")
    assert item is not None
    app.store.put("node/a", {**item.value, "gone": "lease expired"}, version=item.version)
    # when a beats again
    with capture_logs() as logs:
        clock.now += timing(LEASE)[0]
        a.step()
    # then it said so, stopped serving, and is live again with a fresh heartbeat
    assert any(e["event"] == "fleet.declared_gone" for e in logs)
    beat = app.store.get("node/a")
    assert beat is not None and "gone" not in beat.value
    clock.now += 1.0
    a.step()  # nobody took the shards meanwhile: it serves them again
    assert a.held() == sorted(ALL)


def test_a_node_that_cannot_write_its_heartbeat_stops_serving_before_others_may_take(
    app: App,
) -> None:
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    assert len(a.node.shard_refs()) == 6
    # when the store refuses every write for longer than the expiry less a round
    app.store.put("node/a", {"stolen": True}, version=app.store.get("node/a").version)  # type: ignore[union-attr]
    with unreachable(app):
        clock.now += timing(LEASE)[1]
        with capture_logs() as logs:
            a.step()
            a._fence_if_late()  # (as its lease watch does, every quarter round)
    # then it serves nothing, and says why, once
    assert a.node.shard_refs() == [] and a.held() == []
    assert [e["node"] for e in logs if e["event"] == "fleet.fenced"] == ["a"]


def test_a_node_fenced_while_it_drains_shards_says_so_once(app: App) -> None:
    # given a node that serves every shard and is handing three to a joining node
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    b = stepped(app, clock, "b")
    b.step()
    a.step()
    assert len(a.held()) == 6 and len(a.node.shard_refs()) == 3
    with unreachable(app):
        # when its heartbeat cannot be written for longer than the expiry less a round,
        # and its lease watch and rounds look again and again
        clock.now += timing(LEASE)[1]
        with capture_logs() as logs:
            a.step()
            for _ in range(8):
                a._fence_if_late()
            clock.now += 1
            a.step()
    # then it says it stopped serving once, not at each look
    assert [e["node"] for e in logs if e["event"] == "fleet.fenced"] == ["a"]
    assert a.node.shard_refs() == []


def test_a_node_whose_heartbeat_write_hangs_stops_serving_before_others_may_take(
    app: App,
) -> None:
    # given a node that joined and serves every shard
    clock = Clock()
    a = stepped(app, clock, "a")
    a.join()
    wait_for(lambda: len(a.node.shard_refs()) == 6, 10, "a to serve every shard")
    sent, answer, original = threading.Event(), threading.Event(), app.store.put

    def hanging(key: str, *args: object, **kwargs: object) -> object:
        if key == "node/a":  # a call in its retries: up to 17 s by default
            sent.set()
            answer.wait(30)
        return original(key, *args, **kwargs)  # type: ignore[arg-type]

    app.store.put = hanging  # type: ignore[method-assign,assignment]
    try:
        # when its next heartbeat write hangs until others may count it dead
        clock.now += timing(LEASE)[0]
        wait_for(sent.is_set, 5, "the heartbeat write")
        clock.now += timing(LEASE)[1]
        # then it serves nothing while the write still hangs
        wait_for(lambda: a.node.shard_refs() == [], 5, "a to stop serving")
    finally:
        answer.set()
        app.store.put = original  # type: ignore[method-assign]
        a.leave()


def test_two_apps_sharing_a_state_store_keep_apart_fleets(app: App) -> None:
    # given a second app on the same broker and state store (one broker file, say) with
    # another queue_prefix and worker
    config = Config(queue_prefix="o" + app.config.queue_prefix, lease_seconds=LEASE)
    other = App(config, broker=app.broker, store=app.store)
    other.register(type("Tallied", (Worker,), {"shards": 4, "perform": lambda *_: None}))
    clock = Clock()
    a = stepped(app, clock, "a")
    node = other.node(Plan(0, 0, ()), threads=2, membership=None)
    b = Fleet(node, elastic=True, node_id="b", clock=clock)
    # when a node of each steps for a while
    for _ in range(4):
        a.step(), b.step()
        clock.now += 1.0
    # then each serves every shard of its app, and each app's view shows its node alone
    assert a.held() == sorted(ALL) and b.held() == [f"Tallied:{n}" for n in range(4)]
    items, prefix = read_fleet(app.store), app.config.queue_prefix
    view = fleet_view(items, time.time(), {"Ledgered": 6}, prefix)
    assert [n.node for n in view.nodes] == ["a"] and not view.unserved


def test_a_node_whose_report_would_be_over_the_size_limit_beats_without_its_lags(
    tmp_path: Path,
) -> None:
    # given a lone node holding 5,000 shards of workers with long names
    big = App(Config(broker_url=f"sqlite:///{tmp_path}/big.db", lease_seconds=LEASE))
    for w in range(5):
        name = f"InvoiceReconciliationWorkerNumber{w}"
        big.register(type(name, (Worker,), {"shards": 1000, "perform": lambda *_: None}))
    clock = Clock()
    a = stepped(big, clock, "a")
    a.step()
    assert len(a.held()) == 5000
    # when it beats: its report with a lag per shard would be over the store's limit
    clock.now += timing(LEASE)[0]
    a.step()
    # then it wrote its heartbeat, every shard but no lag in it, and serves on
    item = big.store.get("node/a")
    assert item is not None and len(item.value["held"]) == 5000 and item.value["lags"] == {}
    assert len(a.node.shard_refs()) == 5000
    big.broker.close()


def test_a_shard_it_cannot_take_is_logged_and_left_for_another_node(app: App) -> None:
    clock = Clock()
    a = stepped(app, clock, "a")
    broken = a.node.add_shard

    def refuse(ref: object) -> None:
        from shardq.core.errors import BrokerError

        raise BrokerError("CreateQueue was refused: AccessDenied")

    a.node.add_shard = refuse  # type: ignore[method-assign,assignment]
    with capture_logs() as logs:
        a.step()
    a.node.add_shard = broken  # type: ignore[method-assign]
    # then it warned for each shard, freed them, and leaves them a while
    warned = [e for e in logs if e["event"] == "fleet.cannot_take"]
    assert len(warned) == 6 and "AccessDenied" in warned[0]["error"]
    assert owners(app) == {}
    clock.now += 1.0
    a.step()
    assert a.held() == []


def test_with_no_live_node_the_view_shows_every_shard_unserved(app: App) -> None:
    # given a node that held shards was killed and nobody is left to mark it gone
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    item = app.store.get("node/a")
    assert item is not None
    app.store.put("node/a", {**item.value, "at": time.time() - 600}, version=item.version)
    # when an operator looks
    view = fleet_view(read_fleet(app.store), time.time(), {"Ledgered": 6})
    # then no node is live, every shard is unserved, and no lag is shown for them
    assert view.no_live_node and view.unserved == tuple(sorted(ALL))
    assert view.gone[0].reason == "not reporting" and view.lag("Ledgered", 0) is None
    assert view.to_json()["no_live_node"] is True


def test_the_fleet_view_shows_a_nodes_slots_in_use_and_its_job_counts(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node with 4 execution slots, and 12 entities whose jobs run until the test
    # lets them end, one job that fails once and one that can never succeed
    gate = threading.Event()

    def perform(self: ledger.Ledgered, entity_id: str, payloads: list[dict[str, object]]) -> None:
        for payload in payloads:
            if payload.get("gate"):
                gate.wait(60)
            ledger.run_job(entity_id, payload)

    monkeypatch.setattr(ledger.Ledgered, "perform", perform)
    for entity in range(12):
        ledger.Ledgered.publish(f"s{entity}", {"n": 0, "gate": True})
    ledger.Ledgered.publish("r", {"n": 0, "fail": 1})
    ledger.Ledgered.publish("p", {"n": 0, "permanent": True})
    node = app.node(Plan(0, 0, ()), threads=2, membership=ELASTIC, concurrency=4)
    runner = threading.Thread(target=node.run, daemon=True)
    runner.start()

    def nodes() -> list[dict[str, object]]:  # what `shardq nodes --json` prints
        return fleet_view(read_fleet(app.store), time.time()).to_json()["nodes"]  # type: ignore[no-any-return]

    try:
        # when its heartbeats are read while the jobs run, then its report shows
        # every slot in use out of its concurrency
        wait_for(
            lambda: [(n["slots_in_use"], n["concurrency"]) for n in nodes()] == [(4, 4)], 20, "4/4"
        )
        # and once the jobs may end and every job is done, no slot in use, with what was
        # done, retried, failed
        gate.set()
        counts = ("slots_in_use", "done", "retried", "failed")
        wait_for(
            lambda: [tuple(n[k] for k in counts) for n in nodes()] == [(0, 14, 1, 1)], 60, "counts"
        )
    finally:
        gate.set()
        node.stop()
        runner.join(30)


def test_a_fence_during_a_take_leaves_no_shard_served_that_the_node_does_not_hold(
    app: App,
) -> None:
    # given a node whose first take makes its shard's queue while the lease watch finds
    # the node late (its heartbeat stood still too long) and fences it
    clock = Clock()
    a = stepped(app, clock, "a")
    a._beat(clock())
    add = a.node.add_shard

    def fenced_meanwhile(ref: ShardRef) -> None:
        if ref.key == "Ledgered:0":  # the watch thread, during the broker call
            clock.now += timing(LEASE)[1]
            a._fence_if_late()
        add(ref)

    a.node.add_shard = fenced_meanwhile  # type: ignore[method-assign]
    # when the node takes its shards in that round
    a.step()
    # then it serves no shard it does not hold (not the one it was taking then)
    assert keys(a.node) <= set(a.held()) and "Ledgered:0" not in keys(a.node)
    # and a later fence drops whatever it serves, held or not
    a.node.add_shard = add  # type: ignore[method-assign]
    add(a._ref("Ledgered:1"))
    a._fence()
    assert keys(a.node) == set()


def test_a_node_fenced_during_a_round_claims_no_more_shards_in_it(app: App) -> None:
    # given a node whose first take finds it late (its heartbeat writes fail from then
    # on): it is fenced then
    clock = Clock()
    a = stepped(app, clock, "a")
    a.parallel = 1  # one claim at a time (more would be in flight with the first)
    a._beat(clock())
    add, put = a.node.add_shard, app.store.put

    def failing(key: str, *args: object, **kwargs: object) -> object:
        if key == "node/a":
            raise StoreError("the store is unreachable")
        return put(key, *args, **kwargs)  # type: ignore[arg-type]

    def late(ref: ShardRef) -> None:
        clock.now += timing(LEASE)[1]
        app.store.put = failing  # type: ignore[method-assign,assignment]
        add(ref)

    a.node.add_shard = late  # type: ignore[method-assign]
    # when it goes on with the round
    try:
        a.step()
    finally:
        app.store.put = put  # type: ignore[method-assign]
    # then the store names it owner of no shard but the one it claimed before
    assert len(owners(app)) == 1 and keys(a.node) == set()


def test_a_long_round_of_takes_beats_on_and_serves_every_shard(app: App) -> None:
    # given a lone node whose every take makes its shard's queue in 1.5 s, one take at a
    # time: 9 s for the round, longer than the expiry
    clock = Clock()
    a = stepped(app, clock, "a")
    a.parallel = 1
    add = a.node.add_shard

    def slow(ref: ShardRef) -> None:
        clock.now += 1.5
        add(ref)

    a.node.add_shard = slow  # type: ignore[method-assign]
    assert timing(LEASE)[1] < 6 * 1.5
    # when it takes the shards in one round
    a.step()
    # then it beat meanwhile and serves every shard at the end of it
    assert keys(a.node) == ALL and a.held() == sorted(ALL)


def test_a_round_makes_its_takes_side_by_side(app: App) -> None:
    # given a lone node whose takes each wait for three others to be under way (a queue
    # lookup each; one after another they would wait forever)
    clock = Clock()
    a = stepped(app, clock, "a")
    add, together = a.node.add_shard, threading.Barrier(4, timeout=30)

    def side_by_side(ref: ShardRef) -> None:
        if ref.key in {"Ledgered:0", "Ledgered:1", "Ledgered:2", "Ledgered:3"}:
            together.wait()
        add(ref)

    a.node.add_shard = side_by_side  # type: ignore[method-assign]
    # when it takes its shards in one round
    a.step()
    # then they were under way together and it serves every shard
    assert not together.broken and keys(a.node) == ALL and a.held() == sorted(ALL)


def test_a_leaving_nodes_shards_are_free_to_take_before_it_freed_them(app: App) -> None:
    # given node a holding every shard, whose frees as it leaves hang, and node b
    clock = Clock()
    a = stepped(app, clock, "a")
    a._beat(clock())
    a.step()
    b = stepped(app, clock, "b")
    put, hang = app.store.put, threading.Event()

    def hung(key: str, value: Any, **kwargs: Any) -> Item:
        if key.startswith("shard/") and value == {"owner": ""}:
            hang.wait(30)
        return put(key, value, **kwargs)

    app.store.put = hung  # type: ignore[method-assign]
    leaving = threading.Thread(target=a.leave)
    try:
        # when a leaves, and b's round comes while a's frees hang
        leaving.start()
        wait_for(lambda: app.store.get("node/a") is None, 30, "a's heartbeat deleted")
        b._beat(clock())
        b.step()
    finally:
        hang.set()
        leaving.join(30)
        app.store.put = put  # type: ignore[method-assign]
    # then b took every shard at once, and a's late frees undid none of it
    assert keys(b.node) == ALL and owners(app) == {k: "b" for k in ALL}


def test_a_beat_under_way_as_its_node_leaves_does_not_write_its_heartbeat_again(
    app: App,
) -> None:
    # given a node that beat, then left (its heartbeat deleted)
    clock = Clock()
    a = stepped(app, clock, "a")
    a._beat(clock())
    a.leave()
    assert app.store.get("node/a") is None
    # when a beat begun before the leave writes (its version is gone: a conflict)
    a._beat(clock())
    # then the heartbeat stays deleted: others do not wait a lease to take its shards
    assert app.store.get("node/a") is None


def test_a_long_round_of_frees_beats_on(app: App) -> None:
    # given a lone node serving every shard, stepped by hand, and a second node joining
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step()
    b = stepped(app, clock, "b")
    b.step()
    clock.now += 1.0
    a.step()  # frees its 3 shards for b (handed back: the drains end at once here)
    # when each free it then writes takes 2.5 s, one at a time: 7.5 s for the round, past
    # the expiry
    a.parallel = 1
    put = app.store.put

    def slow(key: str, value: Any, **kwargs: Any) -> Item:
        if key.startswith("shard/") and value == {"owner": ""}:
            clock.now += 2.5
        return put(key, value, **kwargs)

    app.store.put = slow  # type: ignore[method-assign]
    clock.now += 1.0
    before = app.store.get("node/a")
    a.step()
    app.store.put = put  # type: ignore[method-assign]
    # then it beat between the frees: its counter moved every beat, never still so long
    after = app.store.get("node/a")
    assert before is not None and after is not None
    assert timing(LEASE)[1] < 7.5 and after.version - before.version >= 3


def test_apps_sharing_a_table_and_a_worker_name_say_so_and_do_not_fight(app: App) -> None:
    # given a second app with another queue_prefix on the same state store (one
    # DynamoDB table named by both store_urls, say) and a worker of the same name
    config = Config(queue_prefix="o" + app.config.queue_prefix, lease_seconds=LEASE)
    other = App(config, broker=app.broker, store=app.store)
    other.register(type("Ledgered", (Worker,), {"shards": 6, "perform": lambda *_: None}))
    clock = Clock()
    a = stepped(app, clock, "a")
    node = other.node(Plan(0, 0, ()), threads=2, membership=None)
    b = Fleet(node, elastic=True, node_id="b", clock=clock)
    # when a node of each steps for a while
    writes, put = [], app.store.put
    with capture_logs() as logs:
        a.step(), b.step()  # a takes every shard; b finds a live
        app.store.put = lambda key, *x, **k: (writes.append(key), put(key, *x, **k))[1]  # type: ignore[method-assign]
        try:
            for _ in range(10):
                a.step(), b.step()
                clock.now += 1.0
        finally:
            app.store.put = put  # type: ignore[method-assign]
    # then each said once that another app uses its store, and neither took a shard
    # from the other
    shared = [(e["prefix"], e["log_level"]) for e in logs if e["event"] == "fleet.store_shared"]
    assert sorted(shared) == sorted(
        [(app.config.queue_prefix, "error"), (config.queue_prefix, "error")]
    )
    assert not [k for k in writes if k.startswith("shard/")]
    assert a.held() == sorted(ALL) and b.held() == []


def test_a_node_of_an_app_sharing_the_store_with_a_longer_lease_is_judged_on_its_lease(
    app: App,
) -> None:
    # given a second app on the same state store with a worker of the same name and a
    # lease four times as long (it beats every 8 s, past this app's 6 s expiry), whose
    # node took every shard first
    config = Config(queue_prefix="o" + app.config.queue_prefix, lease_seconds=4 * LEASE)
    other = App(config, broker=app.broker, store=app.store)
    other.register(type("Ledgered", (Worker,), {"shards": 6, "perform": lambda *_: None}))
    clock = Clock()
    b = Fleet(
        other.node(Plan(0, 0, ()), threads=2, membership=None),
        elastic=True,
        node_id="b",
        clock=clock,
    )
    b.step()
    a = stepped(app, clock, "a")
    # when a node of this app steps beside it for 30 s
    writes, put = [], app.store.put
    app.store.put = lambda key, *x, **k: (writes.append(key), put(key, *x, **k))[1]  # type: ignore[method-assign]
    try:
        for _ in range(30):
            a.step(), b.step()
            clock.now += 1.0
    finally:
        app.store.put = put  # type: ignore[method-assign]
    # then it never claims a shard of the other app's live node
    assert not [k for k in writes if k.startswith("shard/")]
    assert a.held() == [] and b.held() == sorted(ALL)


def test_a_node_fenced_and_declared_gone_mid_round_serves_nothing_another_node_took(
    app: App,
) -> None:
    # given node a owning every shard but fenced by its lease watch (a store write hung),
    # and node b watching it
    clock = Clock()
    a, b = fenced_owner_and_watcher(app, clock)
    assert keys(a.node) == set() and set(owners(app).values()) == {"a"}
    # when a's next round serves its shards again, one at a time (takes ending beside it
    # would let a beat on the test's one clock), and its first take hangs past its expiry
    # while b marks it gone and takes them all (a's next beat finds it gone)
    a.parallel = 1
    add, stalled = a.node.add_shard, []

    def stall(ref: ShardRef) -> None:
        if not stalled:
            stalled.append(ref.key)
            for _ in range(int(timing(LEASE)[1]) + 3):
                clock.now += 1.0
                b.step()
        add(ref)

    a.node.add_shard = stall  # type: ignore[method-assign]
    a.step()
    # then no shard is served by both
    assert not keys(a.node) & keys(b.node)
    assert keys(b.node) == ALL and set(owners(app).values()) == {"b"}


def test_a_take_begun_before_a_beat_found_its_node_gone_serves_nothing(app: App) -> None:
    # given node a owning every shard but fenced, and node b watching it
    clock = Clock()
    a, b = fenced_owner_and_watcher(app, clock)
    # when a's next round serves its shards again, one at a time, and before its first
    # take begins, b marks it gone and takes them all, and a's beat finds it gone (as
    # the round's thread beats while takes run)
    a.parallel = 1
    take, begun = a._take, []

    def late(*args: Any) -> None:
        if not begun:
            begun.append(args)
            for _ in range(int(timing(LEASE)[1]) + 3):
                clock.now += 1.0
                b.step()
            a._beat(clock())
        take(*args)

    a._take = late  # type: ignore[method-assign]
    a.step()
    # then a serves none of the shards b took
    assert keys(a.node) == set() and keys(b.node) == ALL


@pytest.mark.parametrize("shards", [5000, 10000])
def test_a_report_over_the_size_limit_shows_an_unknown_lag_and_every_shard(shards: int) -> None:
    # given a node holding thousands of shards of a long worker name, whose report goes
    # without its lags (5,000 shards), or without its shards too (10,000)
    store, now = MemoryStore(), time.time()
    held = tuple(f"InvoiceReconciliationWorkerNumber0:{n}" for n in range(shards))
    report = Heartbeat("a", at=now, held=held, lags=dict.fromkeys(held, 1.5), expire=6.0)
    store.put("node/a", fit(report.to_value()), version=None)
    for key in held:
        store.put(f"shard/{key}", {"owner": "a"}, version=None)
    # when an operator looks
    view = fleet_view(read_fleet(store), now)
    # then the node shows every shard it owns and no max lag (unknown, never 0)
    (node,) = view.to_json()["nodes"]
    assert node["shards"] == shards and "max_lag" not in node
    assert nodes_text(view).splitlines()[-1].endswith(" -")


def test_a_node_marked_gone_on_an_empty_value_stays_out_of_other_apps_views(app: App) -> None:
    # given node b's heartbeat, of this app, that reads back with a value no write takes
    clock = Clock()
    a = stepped(app, clock, "a")
    prefix = app.config.queue_prefix
    app.store.put("node/b", {"node": "b", "prefix": prefix}, version=None)
    item = app.store.get("node/b")
    assert item is not None
    # when a marks it gone
    mark_gone(
        a.store, Item(item.key, {**item.value, "lags": {"x": math.nan}}, item.version), 1.0, "a"
    )
    # then its item is marked, names its app's prefix, and another app's view leaves it out
    marked = app.store.get("node/b")
    assert marked is not None and marked.value["gone"] == "lease expired"
    assert marked.value["prefix"] == prefix
    assert not fleet_view(read_fleet(app.store), time.time(), None, "o" + prefix).gone


def test_a_heartbeat_naming_no_prefix_counts_in_the_fleet_and_is_marked_gone(app: App) -> None:
    # given a heartbeat whose prefix is null (read as not said: an earlier version's)
    clock = Clock()
    a = stepped(app, clock, "a")
    value = {"node": "b", "mode": "elastic", "at": time.time(), "prefix": None}
    app.store.put("node/b", value, version=None)
    view = fleet_view(read_fleet(app.store), time.time(), None, app.config.queue_prefix)
    assert [n.node for n in view.nodes] == ["b"]
    # when it stands still past the expiry
    a.step()
    clock.now += timing(LEASE)[1] + 1.0
    a.step()
    # then the fleet marks it gone, as it does a heartbeat naming no prefix
    beat = app.store.get("node/b")
    assert beat is not None and beat.value["gone"] == "lease expired"
