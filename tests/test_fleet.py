"""The elastic fleet: leases, presence, balance and handover between real nodes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from shardq import App
from shardq.broker import Message
from shardq.config import Config
from shardq.ensure import ensure_state_table
from shardq.fleet import BOUNCE_SECONDS, IDLE_REPORT_SECONDS, LAPSE_MARGIN_SECONDS, lease_timing
from shardq.fleet_doc import ELASTIC, STALE_SECONDS, FleetDoc, NodeReport
from shardq.fleet_rules import BOUNCE_GIVE_UP_SECONDS, joined, left, take_lease
from shardq.fleet_store import FleetStore, fleet_queue
from shardq.node import Node
from shardq.plan import Plan
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker

DOC = FleetDoc(
    targets={"W:0": "a", "W:1": "b", "W:2": "b"},
    nodes={"b": NodeReport(node="b", host="h", pid=1, started=0.0, seen=0.0, held=("W:2",))},
)


@pytest.mark.parametrize(
    ("key", "me", "live", "bounced_for", "takes"),
    [
        ("W:0", "a", {"a", "b"}, None, True),  # targeted here
        ("W:1", "a", {"a", "b"}, None, False),  # targeted at a live node: its turn
        ("W:1", "a", {"a"}, None, True),  # its target is not live
        ("W:9", "a", {"a", "b"}, None, True),  # no target yet (a new shard)
        ("W:1", "a", {"a", "b"}, 1.0, False),  # came back once: still the target's
        ("W:1", "a", {"a", "b"}, BOUNCE_GIVE_UP_SECONDS, True),  # target not taking it
        ("W:2", "a", {"a", "b"}, None, True),  # its target held it and let it lapse
        ("W:2", "b", {"a", "b"}, None, True),  # the holder itself, back from a lapse
    ],
)
def test_take_lease_decides_from_the_target_and_how_long_it_bounced(
    key: str, me: str, live: set[str], bounced_for: float | None, takes: bool
) -> None:
    assert take_lease(key, me, DOC, live, bounced_for) is takes


@pytest.mark.parametrize(
    ("lease", "hold", "renew"),
    [
        (30, 27, 13.5),  # the default: renewed every half hold
        (120, 117, 58.5),
        (10, 7, 3),  # the minimum: renewed 2 s before the node would give the lease up
    ],
)
def test_a_lease_is_held_3_s_short_of_the_lease_timeout_and_renewed_in_time(
    lease: float, hold: float, renew: float
) -> None:
    assert lease_timing(lease) == (hold, renew)
    assert renew <= hold - LAPSE_MARGIN_SECONDS - 2


def report(node: str, seen: float, held: tuple[str, ...] = (), mode: str = ELASTIC) -> NodeReport:
    return NodeReport(node=node, host="h", pid=1, started=0.0, seen=seen, mode=mode, held=held)


def test_a_write_moves_silent_and_seen_gone_nodes_out_and_retargets_over_the_rest() -> None:
    # given a document with a live node, a silent one and one another node saw go
    doc = FleetDoc(
        nodes={
            "a": report("a", 100.0, ("W:0", "W:1")),
            "silent": report("silent", 100.0 - STALE_SECONDS - 1, ("W:2",)),
            "dead": report("dead", 99.0, ("W:3",)),
            "static": report("static", 100.0, mode="static"),
        }
    )
    # when b writes its report
    after = joined(doc, report("b", 100.0), {"dead": "lease expired"}, 100.0, {"W": 4})
    # then only a, b and the static node stay; the others are gone with their reason
    assert set(after.nodes) == {"a", "b", "static"}
    assert after.gone["silent"].reason == "not reporting"
    assert after.gone["dead"].reason == "lease expired"
    # and the four shards are split between the elastic nodes, a keeping what it holds
    assert sorted(after.targets.values()) == ["a", "a", "b", "b"]
    assert after.targets["W:0"] == after.targets["W:1"] == "a"
    assert set(after.leases) == {"W:0", "W:1", "W:2", "W:3"}


def test_a_write_keeps_an_idle_node_that_announced_a_longer_interval() -> None:
    # given an idle elastic node whose last report, 100 s ago, announced the next
    # within 150 s
    idle = replace(report("idle", 0.0, ("W:0",)), every=150.0)
    # when another node writes 100 s later, then the idle one stays; at 166 s it goes
    kept = joined(FleetDoc(nodes={"idle": idle}), report("b", 100.0), {}, 100.0, {"W": 2})
    assert "idle" in kept.nodes
    gone = joined(FleetDoc(nodes={"idle": idle}), report("b", 166.0), {}, 166.0, {"W": 2})
    assert gone.gone["idle"].reason == "not reporting"


def test_a_node_that_leaves_gets_no_target() -> None:
    doc = FleetDoc(nodes={"a": report("a", 1.0, ("W:0",)), "b": report("b", 1.0, ("W:1",))})
    after = left(doc, "a", 2.0, {"W": 2})
    assert after.gone["a"].reason == "stopped"
    assert after.targets == {"W:0": "b", "W:1": "b"}


# -- real nodes on one broker ---------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(request: pytest.FixtureRequest, tmp_path: Path, ledger_path: str) -> Iterator[App]:
    """The ledger app with 6 shards, 10 s leases and 5 s reports."""
    broker = make_broker(request.param, tmp_path, request)
    config = Config(
        queue_prefix=f"f{time.monotonic_ns() % 10**9}-",
        grace_seconds=10,
        idle_wait_seconds=1,
        lease_seconds=10,
        report_seconds=5,
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
    """Elastic nodes run in threads of this process; stopped at the end of a test."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.nodes: list[tuple[Node, threading.Thread]] = []

    def start(self) -> Node:
        node = Node(app=self.app, plan=Plan(0, 0, ()), threads=2, membership=ELASTIC)
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
    return {f"{r.worker}:{r.shard}" for r in node.shard_refs()}


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


ALL = {f"Ledgered:{n}" for n in range(6)}


def test_a_lone_node_takes_every_shard_and_reports_them(app: App, running: Running) -> None:
    # when one elastic node runs
    node = running.start()
    # then it serves every shard, and the fleet document says so
    wait_for(lambda: keys(node) == ALL, 15, "every shard")
    doc = FleetStore(app.broker, fleet_queue(app.config.queue_prefix)).read()
    assert doc is not None and node.id in doc.nodes
    wait_for(lambda: set(node.fleet.held()) == ALL, 5, "the leases")  # type: ignore[union-attr]


def test_a_joining_node_gets_its_share_and_a_stopping_one_hands_back_at_once(
    app: App, running: Running
) -> None:
    # given a node holding every shard
    first = running.start()
    wait_for(lambda: keys(first) == ALL, 15, "every shard on the first node")
    # when a second node joins
    second = running.start()
    # then within two lease periods each serves half, and no shard is served twice
    wait_for(lambda: len(keys(second)) == 3 and len(keys(first)) == 3, 20, "a fair share")
    assert keys(first) | keys(second) == ALL
    assert not keys(first) & keys(second)
    # when the first stops gracefully
    running.stop(first)
    # then the second serves every shard within a few seconds (not a lease timeout)
    took = wait_for(lambda: keys(second) == ALL, 8, "the handed-back shards")
    assert took < 8
    doc = FleetStore(app.broker, fleet_queue(app.config.queue_prefix)).read()
    assert doc is not None and doc.gone[first.id].reason == "stopped"


def test_a_node_that_stops_renewing_has_its_shards_taken_within_the_lease_timeout(
    app: App, running: Running
) -> None:
    # given two nodes sharing the shards
    first, second = running.start(), running.start()
    wait_for(lambda: len(keys(first)) == 3 and len(keys(second)) == 3, 25, "a fair share")
    lost = keys(first)
    # when the first's membership freezes as if its process were killed (no renewal,
    # no release; its lanes go on, as a killed node's in-flight jobs would reappear)
    assert first.fleet is not None
    first.fleet._stop.set()
    frozen = time.monotonic()
    # then the second holds every shard within the lease timeout (+ a receive)
    wait_for(lambda: keys(second) == ALL, 10 + 5, "the takeover")
    assert time.monotonic() - frozen <= 15
    assert lost <= keys(second)
    # and the first is recorded as gone once its presence expired
    store = FleetStore(app.broker, fleet_queue(app.config.queue_prefix))

    def gone() -> bool:
        doc = store.read()
        return doc is not None and first.id in doc.gone

    wait_for(gone, 15, "the first node recorded as gone")


def test_an_idle_node_reports_seldom_and_at_once_when_it_runs_jobs_again(
    app: App, running: Running
) -> None:
    # given a lone elastic node holding every shard, with nothing to do
    node = running.start()
    store = FleetStore(app.broker, fleet_queue(app.config.queue_prefix))

    def mine() -> NodeReport | None:
        doc = store.read()
        return doc.nodes.get(node.id) if doc else None

    wait_for(lambda: keys(node) == ALL, 15, "every shard")
    # when it has been idle for a report, then it announces its next report in 90 s
    # (its presence on the leases queue, not its report, keeps it live)
    wait_for(lambda: (r := mine()) is not None and r.every == IDLE_REPORT_SECONDS, 20, "idle")
    seen = mine().seen  # type: ignore[union-attr]
    # when it runs a job, then it reports within seconds, at the usual interval again
    Ledgered.publish("e1", {"n": 0})
    wait_for(lambda: (r := mine()) is not None and r.seen > seen and r.done == 1, 15, "report")
    assert mine().every == app.config.report_seconds  # type: ignore[union-attr]


def test_a_node_that_sent_its_presence_again_is_live_and_the_receiver_steps_aside(
    app: App,
) -> None:
    # given a node (not running) and another node's presence, sent long ago, plus the
    # copy that other node sent again because it had not received the first back yet
    node = Node(app=app, plan=Plan(0, 0, ()), threads=1, membership=ELASTIC)
    fleet = node.fleet
    assert fleet is not None
    app.broker.ensure_queue(fleet.queue, visibility_timeout=10)
    now = time.time()

    def presence(sent_at: float, n: int) -> Message:
        return Message(fleet.queue, f"m{n}", f"r{n}", "{}", "node:other", 1, sent_at, str(n))

    old, again = presence(now - 60, 1), presence(now - 1, 2)
    # when this node's poller receives both in one receive
    pause = fleet._received([old, again])
    # then the other node is not taken for gone, and the poller keeps out of the next
    # receive while the presence is handed back (so its own node gets it)
    assert "other" not in fleet._gone
    assert pause >= BOUNCE_SECONDS
    # and when only the old one comes back, the other node is recorded as gone
    with capture_logs() as logs:
        fleet._received([presence(now - 60, 3)])
    assert fleet._gone == {"other": "lease expired"}
    assert [e["node"] for e in logs if e["event"] == "fleet.node_gone"] == ["other"]
