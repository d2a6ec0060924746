"""What operators see of a fleet, from its heartbeat and ownership items."""

from __future__ import annotations

from shardq.ops.fleet_view import (
    NOT_REPORTING,
    fleet_lines,
    fleet_view,
    key_order,
    nodes_text,
    read_fleet,
)
from shardq.store import MemoryStore
from tests.fleet_items import heartbeat

NOW = 1_000_000.0
SHARDS = {"W": 4}


def test_no_item_is_a_fleet_that_never_reported_and_serves_nothing() -> None:
    view = fleet_view(read_fleet(MemoryStore()), NOW, SHARDS)
    assert not view.reported and view.nodes == () and not view.no_live_node
    assert view.unserved == ("W:0", "W:1", "W:2", "W:3")


def test_live_nodes_are_listed_with_what_they_reported_and_own() -> None:
    # given two live nodes, one of them static (its plan's shards, no owner items)
    store = MemoryStore()
    heartbeat(store, "a", NOW - 2, ("W:0", "W:1"), lags={"W:0": 3.5}, jobs_per_second=2.0)
    heartbeat(store, "s", NOW - 1, ("W:2",), mode="static", jobs_per_second=1.0, concurrency=8)
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # then both are live, each shard names its owner and lag, W:3 is unserved
    assert [n.node for n in view.nodes] == ["a", "s"]
    assert view.owners == {"W:0": "a", "W:1": "a", "W:2": "s"}
    assert view.lag("W", 0) == 3.5 and view.lag("W", 1) is None
    assert view.unserved == ("W:3",) and view.jobs_per_second == 3.0
    assert view.to_json()["nodes"][1]["concurrency"] == 8


def test_a_node_marked_gone_is_shown_gone_and_its_shards_unserved_until_taken() -> None:
    store = MemoryStore()
    heartbeat(store, "a", NOW - 2, ("W:0",))
    heartbeat(store, "b", NOW - 30, ("W:1",), gone="lease expired", gone_at=NOW - 5)
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # then b is gone with its reason, its shard has no owner and no lag (never 0)
    assert [n.node for n in view.nodes] == ["a"]
    (gone,) = view.gone
    assert (gone.report.node, gone.reason, gone.gone_at) == ("b", "lease expired", NOW - 5)
    assert gone.unserved == ("W:1",)
    assert view.owner("W", 1) is None and view.lag("W", 1) is None
    assert view.unserved == ("W:1", "W:2", "W:3")


def test_a_stale_heartbeat_is_trusted_while_a_live_node_judges_it() -> None:
    # given b's own clock runs 120 s behind: its time looks old, a live node judges it
    store = MemoryStore()
    heartbeat(store, "a", NOW - 1, ("W:0",))
    heartbeat(store, "b", NOW - 120 - 1, ("W:1",))
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # then b is live (a would have marked it gone if its counter stood still)
    assert [n.node for n in view.nodes] == ["a", "b"] and view.owner("W", 1) == "b"


def test_with_no_live_node_at_all_old_heartbeats_are_shown_not_reporting() -> None:
    store = MemoryStore()
    heartbeat(store, "a", NOW - 600, ("W:0", "W:1"))
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    assert view.no_live_node and view.to_json()["no_live_node"] is True
    assert [(g.report.node, g.reason) for g in view.gone] == [("a", NOT_REPORTING)]
    assert view.unserved == ("W:0", "W:1", "W:2", "W:3")


def test_gone_nodes_are_kept_an_hour_the_latest_first() -> None:
    store = MemoryStore()
    heartbeat(store, "live", NOW, ())
    heartbeat(store, "x", NOW - 100, (), gone="lease expired", gone_at=NOW - 50)
    heartbeat(store, "y", NOW - 100, (), gone="lease expired", gone_at=NOW - 10)
    heartbeat(store, "old", NOW - 9000, (), gone="lease expired", gone_at=NOW - 3700)
    view = fleet_view(read_fleet(store), NOW)
    assert [g.report.node for g in view.gone] == ["y", "x"]
    assert [e["node"] for e in view.excludes(NOW - 20)] == ["y"]


def test_shard_keys_sort_by_worker_generation_then_number() -> None:
    keys = ["W:10", "V:1", "W@2:0", "W:2"]
    assert sorted(keys, key=key_order) == ["V:1", "W:2", "W:10", "W@2:0"]


def test_each_live_node_shows_its_slots_in_use_and_its_counts() -> None:
    # given a node running 12 jobs of its 32 slots, another that reported no slots
    store = MemoryStore()
    counts = {"done": 500, "retried": 9, "failed": 2}
    heartbeat(store, "a", NOW - 2, ("W:0",), concurrency=32, slots_in_use=12, **counts)
    heartbeat(store, "b", NOW - 1, ("W:1",), done=100, retried=1, failed=0)
    # when the fleet is viewed
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # then the JSON carries the slots and the counts of each node
    a, b = view.to_json()["nodes"]
    assert (a["slots_in_use"], a["concurrency"]) == (12, 32)
    assert (a["done"], a["retried"], a["failed"]) == (500, 9, 2)
    assert "slots_in_use" not in b and "concurrency" not in b
    # and `shardq nodes` prints "12/32" for a, "-" for b, with the counts
    header, row_a, row_b = nodes_text(view).splitlines()[:3]
    assert header.split()[-7:-2] == ["slots", "jobs/s", "done", "retried", "failed"]
    assert row_a.split()[-7:-2] == ["12/32", "0.0", "500", "9", "2"]
    assert row_b.split()[-7:-2] == ["-", "0.0", "100", "1", "0"]
    # and on SQS `shardq stats` adds up the live nodes' counts
    assert view.counts() == {"done": 600, "retried": 10, "failed": 2}
    assert "since they started: 600 done, 10 retried, 2 failed" in "\n".join(
        fleet_lines(view, "reports")
    )
    # but not where the broker counts the jobs done itself
    assert not any("since they started" in line for line in fleet_lines(view, "broker"))


def test_the_live_nodes_counts_add_up_per_worker_and_stats_print_them() -> None:
    # given two live nodes counting Billing's jobs, one Mailing's too, and a gone node
    store = MemoryStore()
    a = {"Billing": {"done": 120, "retried": 4, "failed": 1}}
    b = {"Billing": {"done": 30, "retried": 0, "failed": 2}, "Mailing": {"done": 7}}
    heartbeat(store, "a", NOW - 2, ("W:0",), by_worker=a)
    heartbeat(store, "b", NOW - 1, ("W:1",), by_worker=b)
    gone = {"Billing": {"done": 999, "retried": 9, "failed": 9}}
    heartbeat(store, "c", NOW - 90, (), gone="lease expired", gone_at=NOW - 60, by_worker=gone)
    # when the fleet is viewed
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # then each worker's counts are the sum over the live nodes only (a missing count is 0)
    assert view.counts("Billing") == {"done": 150, "retried": 4, "failed": 3}
    assert view.counts("Mailing") == {"done": 7, "retried": 0, "failed": 0}
    assert view.counts("Other") == {"done": 0, "retried": 0, "failed": 0}
    assert view.counted_workers == ("Billing", "Mailing")
    assert view.to_json()["nodes"][1]["by_worker"]["Mailing"]["done"] == 7
    # and on SQS `shardq stats` prints them under the fleet's totals
    lines = fleet_lines(view, "reports")
    assert "    Billing: 150 done, 4 retried, 3 failed" in lines
    assert "    Mailing: 7 done, 0 retried, 0 failed" in lines


def test_a_malformed_per_worker_report_counts_nothing() -> None:
    store = MemoryStore()
    heartbeat(store, "a", NOW, (), by_worker={"Billing": "lots", "Mailing": {"done": "x"}})
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    assert view.counts("Billing")["done"] == 0 and view.counts("Mailing")["done"] == 0


def test_with_no_live_node_nodes_and_stats_say_no_shard_is_served() -> None:
    # given the only node silent for 10 minutes, with jobs waiting in shard 1
    store = MemoryStore()
    heartbeat(store, "a", NOW - 600, ("W:0", "W:1"))
    view = fleet_view(read_fleet(store), NOW, SHARDS)
    # when `shardq nodes` and `shardq stats` print the fleet
    nodes = nodes_text(view, {"W:1": 7})
    stats = fleet_lines(view, "reports", {"W:1": 7})
    # then both say no live node serves anything, and which shards wait with what
    assert nodes.startswith("no live node at all: no shard is served\n")
    assert stats[0] == "no live node at all: no shard is served"
    assert "W:1 (7 waiting)" in stats[-1] and stats[-1].startswith("4 shards served by no")
