"""What operators see of a fleet document, from plain data."""

from __future__ import annotations

from dataclasses import replace

from shardq.fleet_doc import STALE_SECONDS, FleetDoc, NodeReport
from shardq.fleet_view import NOT_REPORTING, fleet_view, key_order

NOW = 1_000_000.0


def report(node: str, seen: float = NOW - 5, **kw: object) -> NodeReport:
    base = NodeReport(node=node, host=f"host-{node}", pid=100, started=NOW - 600, seen=seen)
    return replace(base, **kw)  # type: ignore[arg-type]


def doc(*reports: NodeReport) -> FleetDoc:
    d = FleetDoc()
    for r in reports:
        d = d.with_node(r)
    return d


def test_no_document_is_an_empty_fleet_that_never_reported() -> None:
    view = fleet_view(None, NOW)
    assert not view.reported
    assert view.to_json() == {"time": NOW, "nodes": [], "gone": []}
    assert view.owner("W", 0) is None and view.lag("W", 0) is None


def test_live_nodes_are_listed_with_what_they_reported() -> None:
    # given two nodes that reported a few seconds ago
    a = report("a", held=("W:10", "W:2", "V:0"), lags={"W:2": 3.5, "W:10": 0.0, "V:0": 1.0})
    b = report("b", held=("W:0",), lags={"W:0": 0.0}, jobs_per_second=4.0, max_lag=0.0)
    a = replace(a, jobs_per_second=2.5, done=30, max_lag=3.5, threads=4, version="1.2")
    # when viewed
    view = fleet_view(doc(b, a), NOW)
    # then both are live, by id, and the JSON says all an operator needs
    assert view.reported and [n.node for n in view.nodes] == ["a", "b"] and view.gone == ()
    assert view.jobs_per_second == 6.5
    first = view.to_json()["nodes"][0]
    assert first == {
        "node": "a",
        "host": "host-a",
        "pid": 100,
        "mode": "elastic",
        "version": "1.2",
        "threads": 4,
        "started": NOW - 600,
        "seen": NOW - 5,
        "shards": 3,
        "held": ["V:0", "W:2", "W:10"],
        "jobs_per_second": 2.5,
        "done": 30,
        "max_lag": 3.5,
    }


def test_a_node_not_reporting_for_a_minute_is_shown_gone_since_its_last_report() -> None:
    # given a node whose last report is just over the limit, and one just under it
    late = NOW - STALE_SECONDS - 0.5
    d = doc(report("dead", seen=late, held=("W:0", "W:1")), report("ok", seen=NOW - STALE_SECONDS))
    # when viewed
    view = fleet_view(d, NOW)
    # then the late one is gone, not reporting, since it was last seen; its shards unserved
    assert [n.node for n in view.nodes] == ["ok"]
    (gone,) = view.gone
    assert (gone.report.node, gone.gone_at, gone.reason) == ("dead", late, NOT_REPORTING)
    assert gone.unserved == ("W:0", "W:1")
    assert view.owner("W", 0) is None
    entry = view.to_json()["gone"][0]
    assert (entry["node"], entry["gone_at"], entry["reason"]) == ("dead", late, "not reporting")
    assert entry["unserved"] == ["W:0", "W:1"] and entry["held"] == ["W:0", "W:1"]


def test_gone_nodes_are_kept_an_hour_the_latest_first() -> None:
    # given nodes that went 10 minutes, 59 minutes and 61 minutes ago
    d = doc(report("a"), report("b"), report("c"), report("live"))
    d = d.without_node("a", "stopped", NOW - 600)
    d = d.without_node("b", "lease expired", NOW - 59 * 60)
    d = d.without_node("c", "stopped", NOW - 61 * 60)
    # when viewed
    view = fleet_view(d, NOW)
    # then the two of the last hour are shown, the latest first, with their reasons
    assert [(g.report.node, g.reason) for g in view.gone] == [
        ("a", "stopped"),
        ("b", "lease expired"),
    ]
    assert [g.report.node for g in view.gone_since(NOW - 1800)] == ["a"]
    # and a node silent for over an hour is not shown at all
    assert fleet_view(doc(report("old", seen=NOW - 3700)), NOW).gone == ()


def test_owner_and_lag_of_each_shard_come_from_the_live_holder() -> None:
    # given a takeover: the dead node still lists W:1, the new holder reports it too
    dead = report("dead", seen=NOW - 90, held=("W:0", "W:1"), lags={"W:0": 9.0, "W:1": 9.0})
    new = report("new", held=("W:1", "W:2"), lags={"W:1": 4.0, "W:2": 0.0})
    older = report("older", seen=NOW - 30, held=("W:2",), lags={"W:2": 7.0})
    # when viewed
    view = fleet_view(doc(dead, new, older), NOW)
    # then the live holders own their shards with their own lags (the latest report wins)
    assert (view.owner("W", 1), view.lag("W", 1)) == ("new", 4.0)
    assert (view.owner("W", 2), view.lag("W", 2)) == ("new", 0.0)
    # and a shard only the dead node held has no owner and no lag
    assert (view.owner("W", 0), view.lag("W", 0)) == (None, None)
    assert view.gone[0].unserved == ("W:0",)
    # and a holder that reported no lag for a shard gives none
    quiet = fleet_view(doc(report("q", held=("W:5",))), NOW)
    assert (quiet.owner("W", 5), quiet.lag("W", 5)) == ("q", None)


def test_a_node_back_after_going_is_live_only() -> None:
    d = doc(report("a")).without_node("a", "stopped", NOW - 100).with_node(report("a"))
    view = fleet_view(d, NOW)
    assert [n.node for n in view.nodes] == ["a"] and view.gone == ()


def test_shard_keys_sort_by_worker_then_number() -> None:
    keys = ["W:10", "V:1", "W:2", "odd"]
    assert sorted(keys, key=key_order) == ["V:1", "W:2", "W:10", "odd"]


def test_an_idle_node_that_announced_a_longer_report_interval_stays_live_until_then() -> None:
    # given a node that said its next report comes within 150 s (an idle elastic node)
    seen = NOW - 100
    idle = report("idle", seen=seen, every=150.0, held=("W:0",))
    # when the view is taken 100 s after that report, then it is live
    assert [n.node for n in fleet_view(doc(idle), NOW).nodes] == ["idle"]
    # and 15 s past its due time it is shown gone, not reporting
    view = fleet_view(doc(idle), seen + 150 + 15.5)
    assert not view.nodes and view.gone[0].reason == NOT_REPORTING
