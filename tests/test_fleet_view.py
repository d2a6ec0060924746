"""What operators see of a fleet, from its heartbeat and ownership items."""

from __future__ import annotations

from shardq.fleet_view import NOT_REPORTING, fleet_view, key_order, read_fleet
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
    assert [g.report.node for g in view.gone_since(NOW - 20)] == ["y"]


def test_shard_keys_sort_by_worker_generation_then_number() -> None:
    keys = ["W:10", "V:1", "W@2:0", "W:2"]
    assert sorted(keys, key=key_order) == ["V:1", "W:2", "W:10", "W@2:0"]
