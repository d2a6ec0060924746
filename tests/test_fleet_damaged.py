"""The elastic fleet with damaged items in the store (a hand edit, a damaged file): no
node stops, no shard is served by two live nodes, and the items are rewritten."""

from __future__ import annotations

import sqlite3
import time

import pytest
from structlog.testing import capture_logs

from shardq import App
from shardq.core.fleet_rules import timing
from shardq.ops.fleet_view import fleet_view, read_fleet
from shardq.store import SqliteStore
from shardq.store.base import MAX_VALUE_BYTES
from shardq.store.dynamo import DynamoStore
from tests.test_fleet import ALL, LEASE, Clock, balanced_pair, keys, owners, stepped
from tests.test_fleet import app as app
from tests.test_fleet import lease as lease
from tests.test_fleet import ledger_path as ledger_path


def damage(app: App, key: str, text: str, bump: int = 0) -> None:
    """Overwrite the stored value of item ``key`` around the store, as a hand edit or a
    damaged file would, its version moved on by ``bump``."""
    store = app.store
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            update = f'UPDATE "{store.table}" SET value = ?, version = version + ? WHERE key = ?'
            db.execute(update, (text, bump, key))
    else:
        assert isinstance(store, DynamoStore)
        ids = {"ns": {"S": key.partition("/")[0]}, "key": {"S": key}}
        found = store.client.get_item(TableName=store.table, Key=ids, ConsistentRead=True)
        version = {"N": str(int(found["Item"]["version"]["N"]) + bump)}
        item = {**found["Item"], "value": {"S": text}, "version": version}
        store.client.put_item(TableName=store.table, Item=item)


def damaged_logs(logs: list[dict[str, object]]) -> list[object]:
    return [e["item"] for e in logs if e["event"] == "fleet.item_damaged"]


def readable(app: App) -> bool:
    items = [i for p in ("node/", "shard/") for i in app.store.query_all(p, keep_damaged=True)]
    return not any(i.damaged for i in items)


def test_a_shard_whose_item_and_holders_heartbeat_are_damaged_is_never_served_twice(
    app: App,
) -> None:
    # given a node holding every shard, then its heartbeat and one ownership item damaged
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    damage(app, "shard/Ledgered:0", "[1")
    damage(app, "node/a", "null")
    # when a second node joins and both step for a while
    b = stepped(app, clock, "b")
    with capture_logs() as logs:
        for _ in range(8):
            b.step(), a.step()
            clock.now += 1.0
            # then no shard is served by both at any time
            assert not keys(a.node) & keys(b.node)
    # and each node logged each item once; a rewrote both; the shards end up balanced
    assert sorted(damaged_logs(logs)) == 2 * ["node/a"] + 2 * ["shard/Ledgered:0"]
    assert readable(app)
    assert len(a.held()) == 3 and len(b.held()) == 3 and set(a.held()) | set(b.held()) == ALL


def test_a_damaged_ownership_item_nobody_serves_is_claimed_after_a_lease(app: App) -> None:
    # given every shard freed by a node that left, then one ownership item damaged
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    a.leave()
    damage(app, "shard/Ledgered:3", "null")
    # when another node steps
    b = stepped(app, clock, "b")
    with capture_logs() as logs:
        b.step(), b.step()
    # then it takes every other shard but leaves that one alone (an owner may yet show)
    assert b.held() == sorted(ALL - {"Ledgered:3"})
    assert damaged_logs(logs) == ["shard/Ledgered:3"]
    # and once the item stood unchanged for the expiry, it takes it and rewrites the item
    clock.now += timing(LEASE)[1]
    b.step()
    assert b.held() == sorted(ALL) and owners(app) == dict.fromkeys(ALL, "b")
    assert readable(app)


@pytest.mark.parametrize(
    ("beating", "bump"), [(True, 0), (True, 1), (False, 0)], ids=["live", "live-moved", "dead"]
)
def test_a_damaged_heartbeat_is_rewritten_by_its_node_or_once_it_stood_still(
    app: App, beating: bool, bump: int
) -> None:
    # given two balanced nodes, and b's heartbeat damaged (its version moved on or not)
    clock = Clock()
    a, b = balanced_pair(app, clock)
    damage(app, "node/b", "not json", bump)
    # when both step on for a lease (b only if it is live)
    for _ in range(int(LEASE) + 2):
        a.step()
        if beating:
            b.step()
            # then a live b keeps its share all along
            assert len(a.held()) == 3 and len(b.held()) == 3
        elif a.held() != sorted(ALL):
            # a dead b's shards are left alone until its heartbeat expires
            assert len(a.held()) == 3
        clock.now += 1.0
    item = app.store.get("node/b")
    assert item is not None
    if beating:  # and its next beat rewrote its heartbeat
        assert item.value["node"] == "b" and "gone" not in item.value
    else:  # a dead b was marked gone (the item rewritten) and its shards taken
        assert item.value["gone"] == "lease expired"
        assert a.held() == sorted(ALL)


def damage_version(app: App, key: str, version: str | None) -> None:
    """Retype, make negative or drop (SQLite: empty) the version of item ``key``."""
    store = app.store
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            sql = f'UPDATE "{store.table}" SET version = ? WHERE key = ?'
            db.execute(sql, ("" if version is None else version, key))  # the column is NOT NULL
    else:
        assert isinstance(store, DynamoStore)
        ids = {"ns": {"S": key.partition("/")[0]}, "key": {"S": key}}
        found = store.client.get_item(TableName=store.table, Key=ids, ConsistentRead=True)
        item = {k: v for k, v in found["Item"].items() if k != "version"}
        if version is not None:
            item["version"] = {"S": version}
        store.client.put_item(TableName=store.table, Item=item)


@pytest.mark.parametrize("version", ["x", "-1", None])
def test_a_shard_whose_item_version_cannot_be_read_stays_with_its_server(
    app: App, version: str | None
) -> None:
    # given a node serving every shard, then one ownership item's version damaged
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    damage_version(app, "shard/Ledgered:4", version)
    # when a second node joins and both step for longer than a lease
    b = stepped(app, clock, "b")
    with capture_logs() as logs:
        for _ in range(int(LEASE) + 4):
            b.step(), a.step()
            clock.now += 1.0
            # then the first node keeps that shard all along (no write can name its
            # version: freed, nobody could take it), the others are shared
            assert "Ledgered:4" in keys(a.node) and not keys(a.node) & keys(b.node)
    assert keys(a.node) | keys(b.node) == ALL and len(b.held()) >= 2
    # and each node logged the item once
    assert damaged_logs(logs) == 2 * ["shard/Ledgered:4"]


def test_a_node_whose_heartbeat_version_cannot_be_read_replaces_it(app: App) -> None:
    # given a node serving every shard, then its heartbeat's version damaged
    clock = Clock()
    a = stepped(app, clock, "a")
    a.step(), a.step()
    damage_version(app, "node/a", "x")
    # when it beats again
    with capture_logs() as logs:
        clock.now += timing(LEASE)[0]
        a.step()
    # then its heartbeat is readable again and it serves on, with no warning
    assert readable(app) and a.held() == sorted(ALL)
    assert not [e for e in logs if e["log_level"] == "warning"]


def test_a_dead_nodes_heartbeat_whose_version_cannot_be_read_frees_its_shards_after_a_lease(
    app: App,
) -> None:
    # given two balanced nodes; b dies and its heartbeat's version is damaged
    clock = Clock()
    a, _ = balanced_pair(app, clock)
    damage_version(app, "node/b", "x")
    # when a steps on: b's shards are left alone until its heartbeat stood still a lease
    expire = timing(LEASE)[1]
    while clock.now < 1004.0 + expire - 1.0:
        a.step()
        assert len(a.held()) == 3
        clock.now += 1.0
    # then a takes them (it cannot mark b gone: no write names that version)
    clock.now += 2.0
    a.step(), a.step()
    assert a.held() == sorted(ALL)


BIG = "1" + "0" * 400  # a JSON integer too large for a float
FOREIGN = {
    "huge-number": '{"node":"x","started":' + BIG + ',"lags":{"Ledgered:0":' + BIG + "}}",
    "nan": '{"node":"x","at":NaN,"lags":{"Ledgered:0":Infinity}}',
    "near-the-size-limit": '{"node":"x","pad":"' + "x" * (MAX_VALUE_BYTES - 24) + '"}',
}


@pytest.mark.parametrize("text", FOREIGN.values(), ids=FOREIGN)
def test_a_heartbeat_shardq_cannot_write_back_is_read_and_marked_gone(app: App, text: str) -> None:
    # given a heartbeat of node x as a newer version or a hand edit may write it: numbers
    # no float holds, NaN, a value that a mark of "gone" would take over the size limit
    app.store.put("node/x", {"node": "x"}, version=None)
    damage(app, "node/x", text)
    # when a node steps until x's counter stood still past the expiry
    clock = Clock()
    a = stepped(app, clock, "a")
    for _ in range(int(timing(LEASE)[1]) + 3):
        a.step()
        clock.now += 1.0
    # then it never stopped: x was marked gone and a serves every shard; the views read x
    item = app.store.get("node/x")
    assert item is not None and item.value["gone"] == "lease expired"
    assert a.held() == sorted(ALL)
    view = fleet_view(read_fleet(app.store), time.time(), {"Ledgered": 6})
    assert [g.report.node for g in view.gone] == ["x"] and not view.unserved
