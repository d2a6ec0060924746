"""What operators see of a reshard: stats, nodes, the dashboard's API, `queues ensure`
and its --prune (nodes not running: the layout document is written by hand)."""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.broker import SendEntry
from shardq.core import envelope
from shardq.core import layout as rules
from shardq.core.topology import shard_for
from shardq.ops import reshard
from shardq.ops.admin import NO_REPORT, _nodes, _stats
from shardq.ops.ensure import ensure, ensure_state_table
from shardq.ops.fleet_view import FleetView, fleet_view, key_order, read_fleet
from shardq.ops.layout_view import layout_view
from shardq.ops.sampler import Sampler
from shardq.ops.stats import collect
from shardq.reshard.prune import prune
from shardq.store import MemoryStore
from shardq.store.deployment import live_shards
from tests.conftest import make_broker
from tests.fleet_items import heartbeat
from tests.test_dashboard import browser, chromium  # noqa: F401 (the headless Chromium fixture)


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


def make_app(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> shardq.App:
    broker = make_broker(kind, tmp_path, request)
    config = shardq.Config(queue_prefix=f"r{uuid.uuid4().hex[:8]}-", reshard_trust_seconds=15)
    app = shardq.App(config, broker=broker)
    app.register(type("SyncOrder", (shardq.Worker,), {"perform": _perform, "shards": 4}))
    app.register(type("Mail", (shardq.Worker,), {"perform": _perform, "shards": 2}))
    ensure_state_table(app)
    return app


@pytest.fixture
def app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[shardq.App]:
    instance = make_app("sqlite", tmp_path, request)
    yield instance
    instance.broker.close()


@pytest.fixture
def resharding(app: shardq.App) -> shardq.App:
    """SyncOrder: 3 jobs published at 4 shards, a reshard to 16 switched, 2 jobs in the
    new layout (as a publisher past the switch sends them)."""
    worker = app.worker("SyncOrder")
    worker.publish_many([("o1", {"n": 0}), ("o2", {"n": 0}), ("o1", {"n": 1})])
    layout = reshard.start(app, "SyncOrder", 16)
    app.layouts.update("SyncOrder", lambda w: rules.switch(w, layout.gen))
    for entity, n in [("o1", 2), ("o3", 0)]:
        body = envelope.encode(envelope.Envelope("SyncOrder", entity, {"n": n}, time.time(), {}))
        queue = app.shard_queue("SyncOrder", shard_for(entity, 16), layout.gen)
        assert not app.broker.send_batch(
            queue, [SendEntry("0", body, entity, f"{entity}{n}")]
        ).failed
    return app


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**kw)


# -- stats ------------------------------------------------------------------------------
def test_stats_json_shows_the_move_and_the_jobs_still_in_the_old_layout(
    resharding: shardq.App,
) -> None:
    # when the stats are read
    data = collect(resharding).to_dict()
    sync = data["by_worker"]["SyncOrder"]
    # then the live layout is generation 1 with 16 shards, the code still says 4
    layout = sync["layout"]
    assert (layout["gen"], layout["shards"], layout["code_shards"]) == (1, 16, 4)
    assert layout["note"] == (
        "SyncOrder: code says 4 shards, live layout has 16 (resharded); the live layout is used"
    )
    # and the move is shown: from, to, its phase, old shards open, old jobs
    move = layout["reshard"]
    assert (move["from"], move["to"], move["from_gen"], move["to_gen"]) == (4, 16, 0, 1)
    assert (move["old_shards_open"], move["old_shards"], move["old_jobs"]) == (4, 4, 3)
    assert move["phase"] == "switched" and move["trust"] == 15 and move["open"] == [0, 1, 2, 3]
    # and, no node running, it says the move cannot progress
    assert move["unserved"] == [0, 1, 2, 3]
    assert move["stuck"].startswith("no node serves the old shards (is any node running?")
    # and the shards are the current generation's 16 (shards[n] is shard n), then the old 4
    rows = sync["shards"]
    assert [(r["gen"], r["shard"]) for r in rows] == [(1, n) for n in range(16)] + [
        (0, n) for n in range(4)
    ]
    assert rows[shard_for("o3", 16)]["length"] == 1
    assert rows[16 + shard_for("o2", 4)]["queue"].endswith(f"-{shard_for('o2', 4)}.fifo")
    assert sync["length"] == 5
    # and a worker never resharded is at its code's layout, without a move or note
    mail = data["by_worker"]["Mail"]["layout"]
    assert (mail["gen"], mail["shards"], mail["note"], mail["reshard"]) == (0, 2, None, None)
    assert data["layout_error"] is None


def test_the_live_shards_of_an_app_are_every_workers_live_generations(
    resharding: shardq.App,
) -> None:
    # given SyncOrder moving from 4 shards to 16, Mail never resharded
    # when the app's live shards are read (as the fleet and stats read them)
    shards = live_shards(resharding)
    # then they are both of SyncOrder's generations and Mail's one
    assert shards == {"SyncOrder": 4, "SyncOrder@1": 16, "Mail": 2}


def test_stats_text_says_the_move_and_that_the_live_layout_is_used(
    resharding: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # when `shardq stats` prints
    assert _stats(resharding, args(json=False)) == 0
    out, err = capsys.readouterr()
    # then the table has the new generation's shards and the old one's, marked
    lines = out.splitlines()
    assert lines[-1].split()[:2] == ["total", "5"]
    assert any(line.split()[0] == "[@1:15]" for line in lines)
    assert any(line.split()[0] == "[3]" for line in lines)
    # and under it the live layouts, the code's drift and the move in progress
    assert "live layouts: SyncOrder 16 shards (generation 1); Mail 2 shards (generation 0)" in err
    assert "SyncOrder: code says 4 shards, live layout has 16 (resharded)" in err
    assert "SyncOrder: resharding 4 -> 16 shards (generation 0 -> 1), " in err
    assert "4 of 4 old shards still open; 3 jobs still in the old layout" in err


def test_stats_of_a_class_whose_shards_changed_without_a_reshard_do_not_say_resharded(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given SyncOrder recorded with 4 shards, and an app whose code says 6
    app.worker("SyncOrder").publish("o1", {"n": 0})
    other = shardq.App(app.config, broker=app.broker, store=app.store)
    other.register(type("SyncOrder", (shardq.Worker,), {"perform": _perform, "shards": 6}))
    # when its `shardq stats` prints, then it shows the recorded layout and says the code
    # is refused (not that it was resharded and is used)
    assert _stats(other, args(json=False)) == 0
    err = capsys.readouterr().err
    assert "SyncOrder: code says 6 shards, its queues were recorded with 4; " in err
    assert "until `shardq reshard SyncOrder --shards 6`" in err
    assert "(resharded)" not in err and "the live layout is used" not in err


def test_stats_reads_a_layout_changed_by_another_process(app: shardq.App, tmp_path: Path) -> None:
    # given stats read once at the code's layout
    assert collect(app).to_dict()["by_worker"]["SyncOrder"]["layout"]["shards"] == 4
    # when another process (another app object on the same broker file) reshards
    broker = shardq.SqliteBroker(str(tmp_path / "broker.db"))
    other = shardq.App(app.config, broker=broker, store=app.store)
    other.register(type("SyncOrder", (shardq.Worker,), {"perform": _perform, "shards": 4}))
    reshard.start(other, "SyncOrder", 8)
    other.broker.close()
    # then the next stats show it at once (the layout is read again, not the cached copy)
    layout = collect(app).to_dict()["by_worker"]["SyncOrder"]["layout"]
    assert layout["shards"] == 8 and layout["reshard"]["to"] == 8


def test_stats_after_the_move_show_the_retired_generation_until_its_queues_go(
    resharding: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given every old shard closed
    close_all(resharding, "SyncOrder")
    # when the stats are read
    data = collect(resharding).to_dict()["by_worker"]["SyncOrder"]
    # then only generation 1's shards are rows, and no move is shown
    assert {r["gen"] for r in data["shards"]} == {1} and len(data["shards"]) == 16
    assert data["layout"]["reshard"] is None
    assert data["layout"]["retired"][0]["gen"] == 0
    assert data["layout"]["retired"][0]["queues_left"] == 4
    # and a move with one job left says "1 job"
    view = layout_view("W", rules.announce(rules.WorkerLayout(0, 2), "W", 3, 60.0), 2, 1)
    assert view.reshard is not None and view.reshard.text().endswith(
        "1 job still in the old layout"
    )
    _stats(resharding, args(json=False))
    assert "SyncOrder: generation 0 retired (4 shards); 4 of its queues" in capsys.readouterr().err


# -- nodes ------------------------------------------------------------------------------
def test_nodes_show_a_reshard_in_progress_in_text_and_json(
    resharding: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # when `shardq nodes` prints with no node ever reported
    assert _nodes(resharding, args(json=False)) == 0
    out, err = capsys.readouterr()
    # then one line says the move, and stderr that no node ever reported
    assert NO_REPORT in err
    (line,) = out.splitlines()
    assert line.startswith("SyncOrder: resharding 4 -> 16 shards (generation 0 -> 1)")
    assert line.endswith("4 of 4 old shards still open; 3 jobs still in the old layout")
    # and the JSON has the same fields
    assert _nodes(resharding, args(json=True)) == 0
    (move,) = json.loads(capsys.readouterr().out)["reshards"]
    assert (move["worker"], move["from"], move["to"], move["old_jobs"]) == ("SyncOrder", 4, 16, 3)
    assert (move["old_shards_open"], move["old_shards"]) == (4, 4)


def test_shard_keys_of_later_generations_are_owned_counted_and_sorted() -> None:
    # given a node holding shards of generations 0, 2 and 10 of one worker
    now = 1_000_000.0
    held = ("W@10:1", "W@2:5", "W:3", "W@2:0")
    lags = {"W@2:5": 4.0, "W:3": 1.0}
    store = MemoryStore()
    heartbeat(store, "a", now - 1, held, lags=lags)
    view = fleet_view(read_fleet(store), now)
    # then each shard has its owner and lag by generation, and none is mixed up
    assert view.owner("W", 5, 2) == "a" and view.lag("W", 5, 2) == 4.0
    assert view.owner("W", 3) == "a" and view.lag("W", 3) == 1.0
    assert view.owner("W", 5) is None and view.owner("W", 3, 2) is None
    # and the JSON counts 4 shards, sorted by worker, generation, shard
    node = view.to_json()["nodes"][0]
    assert node["shards"] == 4
    assert node["held"] == ["W:3", "W@2:0", "W@2:5", "W@10:1"]
    # and keys of other shapes do not break the order
    assert sorted(["W@x:1", "W:2", "odd"], key=key_order) == ["W:2", "W@x:1", "odd"]


def test_stats_name_the_owner_of_a_new_generations_shard(resharding: shardq.App) -> None:
    # given a node reporting it holds shard 5 of generation 1 and shard 2 of generation 0
    now = time.time()
    heartbeat(resharding.store, "n1", now, ("SyncOrder@1:5", "SyncOrder:2"))
    # then the stats name it on those two rows only
    data = collect(resharding).to_dict()["by_worker"]["SyncOrder"]
    owned = [(r["gen"], r["shard"]) for r in data["shards"] if r["owner"] == "n1"]
    assert owned == [(1, 5), (0, 2)]
    # and the reshard says it is stuck behind the old shards nobody holds
    move = data["layout"]["reshard"]
    assert move["unserved"] == [0, 1, 3]
    assert move["stuck"].startswith(
        "3 old shards (SyncOrder:0, SyncOrder:1, SyncOrder:3) held by no node: the reshard "
        "cannot end until a node serves them"
    )


def test_a_reshard_with_no_node_serving_any_old_shard_says_so() -> None:
    # given a switched move whose old shards no live node holds (none is running)
    layout = rules.switch(rules.announce(rules.WorkerLayout(0, 2), "W", 3, 60.0), 1)
    view = layout_view("W", layout, 2, 5, FleetView(0.0))
    # then its line says no node serves them, instead of only counting open shards
    assert view.reshard is not None
    assert view.reshard.text().endswith(
        "5 jobs still in the old layout; STUCK: no node serves the old shards (is any node "
        "running? shardq nodes): the reshard does not progress until one does"
    )


# -- the dashboard's API ------------------------------------------------------------------
def test_the_dashboard_sample_carries_the_move_to_stats_and_nodes(resharding: shardq.App) -> None:
    sampler = Sampler(resharding, refresh=5.0)
    sampler.sample()
    stats = sampler.snapshot()
    assert stats["by_worker"]["SyncOrder"]["layout"]["reshard"]["old_jobs"] == 3
    (move,) = sampler.nodes()["reshards"]
    assert (move["worker"], move["from"], move["to"], move["old_shards_open"]) == (
        "SyncOrder",
        4,
        16,
        4,
    )


# -- queues ensure ------------------------------------------------------------------------
def test_queues_ensure_creates_the_live_layouts_queues_and_says_the_code_differs(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a layout document moving SyncOrder to 6 shards, none of its queues made
    app.layouts.update("SyncOrder", lambda w: rules.announce(w, "SyncOrder", 6, 60.0))
    # when the queues are ensured
    assert ensure(app) == 0
    err = capsys.readouterr().err
    # then the new generation's 6, the old one's 4 and Mail's 2 (the fleet and the dead
    # jobs have no queue: they live in the state store)
    assert "12 queues created, 0 checked, 0 drifted" in err
    for shard in range(6):
        assert app.broker.queue_settings(app.shard_queue("SyncOrder", shard, 1)) is not None
    assert app.broker.queue_settings(app.shard_queue("SyncOrder", 3, 0)) is not None
    # and a line says the code's shards are not the live layout's
    assert "layout: SyncOrder: code says 4 shards, live layout has 6 (resharded)" in err
    assert "Mail: code says" not in err


# -- prune --------------------------------------------------------------------------------
def close_all(app: shardq.App, worker: str) -> rules.WorkerLayout:
    def change(w: rules.WorkerLayout) -> rules.WorkerLayout:
        w = rules.switch(w, w.gen)
        for shard in range(w.moving.shards if w.moving else 0):
            w = rules.close(w, w.moving.gen if w.moving else 0, shard)
        return w

    return app.layouts.update(worker, change)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def test_prune_deletes_empty_retired_queues_and_keeps_the_rest(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    app = make_app(kind, tmp_path, request)
    try:
        # given SyncOrder moved from 4 to 2 shards, the move ended
        app.ensure_queues()
        app.layouts.update("SyncOrder", lambda w: rules.announce(w, "SyncOrder", 2, 5.0))
        layout = close_all(app, "SyncOrder")
        assert layout.retired == (rules.Retired(0, 4),)
        app.ensure_queues()  # generation 1's queues
        # and a job left in old shard 1
        old = app.shard_queue("SyncOrder", 1, 0)
        app.broker.send_batch(old, [SendEntry("0", "{}", "o9", "d9")])
        # when pruned
        done = prune(app)
        # then the empty old queues are deleted and recorded, the one with a job kept
        gone = [app.shard_queue("SyncOrder", s, 0) for s in (0, 2, 3)]
        assert sorted(done.deleted) == sorted(gone)
        ((kept, why),) = done.kept
        assert kept == old and why.startswith("not empty (1 waiting, 0 in flight)")
        for queue in gone:
            assert app.broker.queue_settings(queue) is None
        assert app.broker.queue_settings(old) is not None
        assert app.layouts.read("SyncOrder").retired[0].left == [1]
        # and the current generation's queues and Mail's are untouched
        for queue in [app.shard_queue("SyncOrder", s, 1) for s in range(2)] + [
            app.shard_queue("Mail", s) for s in range(2)
        ]:
            assert app.broker.queue_settings(queue) is not None
        # when the job has left and `queues ensure --prune` runs
        (message,) = app.broker.receive(old, max_messages=1, wait_seconds=0, visibility_timeout=30)
        app.broker.delete_batch(old, [message.receipt])
        capsys.readouterr()
        assert ensure(app, with_prune=True) == 0
        out, err = capsys.readouterr()
        # then the last old queue goes, and generation 0 leaves the item
        assert f"pruned: {old}" in out
        assert "1 retired deleted, 0 retired kept" in err
        assert app.broker.queue_settings(old) is None
        assert app.layouts.read("SyncOrder").retired == ()
        # and the old generation is not created again
        assert app.broker.queue_settings(app.shard_queue("SyncOrder", 0, 0)) is None
    finally:
        app.broker.close()


def test_prune_never_touches_a_moving_generation(app: shardq.App) -> None:
    # given a reshard in progress (old shards open, their queues empty)
    app.ensure_queues()
    app.layouts.update("SyncOrder", lambda w: rules.announce(w, "SyncOrder", 8, 5.0))
    # when pruned
    done = prune(app)
    # then nothing is deleted or kept: no retired generation yet
    assert done.deleted == [] and done.kept == []
    assert app.broker.queue_settings(app.shard_queue("SyncOrder", 0, 0)) is not None


def test_the_page_shows_a_resharding_banner(browser: Any, resharding: shardq.App) -> None:  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from shardq.ops.dashboard import make_server
    from tests.test_dashboard import LAYOUT_PROBLEMS, set_width, text_of

    # given a dashboard while SyncOrder moves from 4 to 16 shards
    srv = make_server(resharding, "127.0.0.1", 0, refresh=0.5).start()
    try:
        wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])
        set_width(browser, 1400)
        browser.get(srv.url)
        # then a banner says the move: from, to, old shards open, jobs in the old layout
        wait.until(lambda d: d.find_element(By.ID, "reshard-banner").is_displayed())
        line = text_of(browser, '#reshard-banner div[data-worker="SyncOrder"]')
        assert line.startswith("SyncOrder 4 → 16 shards · "), line
        assert "switched · 4 of 4 old shards open · 3 jobs in the old layout" in line, line
        # and, no node running, that the move cannot progress
        assert line.endswith(
            "stuck: no node serves the old shards (is any node running? "
            "shardq nodes): the reshard does not progress until one does"
        ), line
        assert text_of(browser, "#reshard-banner .title") == "RESHARDING"
        # and the worker's card gives the live layout, not the code's
        meta = text_of(browser, '[data-worker="SyncOrder"] .meta')
        assert meta.startswith("16 shards (generation 1)"), meta
        # and it fits a phone and a wide screen
        for width in (1400, 420):
            set_width(browser, width)
            assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
    finally:
        srv.stop()


def test_without_a_reshard_nodes_json_keeps_its_shape(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given the app's queues and no reshard ever
    app.ensure_queues()
    assert _nodes(app, args(json=True)) == 0
    # then `shardq nodes --json` has no "reshards" key, like the dashboard's sample
    shape = {"time", "nodes", "gone", "unserved", "no_live_node", "damaged"}
    assert set(json.loads(capsys.readouterr().out)) == shape


# -- a stuck reshard names the node that last held its old shards ---------------------------
def test_a_stuck_reshard_names_the_node_that_last_held_each_old_shard() -> None:
    # given a switched move of W from 4 to 6 shards; old shards 1 and 3 held by no node,
    # node-e90b (gone) held shard 1 last, nobody is known to have held shard 3
    layout = rules.switch(rules.announce(rules.WorkerLayout(0, 4), "W", 6, 60.0), 1)
    owners = {"W:0": "n1", "W:2": "n1"}
    fleet = FleetView(0.0, True, owners=owners, last_held={"W:1": "node-e90b", "W:0": "n0"})
    view = layout_view("W", layout, 4, 5, fleet)
    # then the reshard says it is stuck behind those two, and which node held shard 1
    assert view.reshard is not None
    assert view.reshard.stuck == (
        "2 old shards (W:1, W:3) held by no node: the reshard cannot end until a node "
        "serves them (start one: shardq run); last held by node-e90b (W:1)"
    )
    assert view.reshard.to_json()["last_held"] == {"1": "node-e90b"}  # served ones left out
    # and with no node serving any old shard, every last holder is named
    nobody = FleetView(0.0, True, last_held={"W:0": "a", "W:1": "b", "W:3": "a"})
    none = layout_view("W", layout, 4, 5, nobody)
    assert none.reshard is not None and none.reshard.stuck is not None
    assert none.reshard.stuck.endswith(
        "the reshard does not progress until one does; last held by a (W:0, W:3); "
        "last held by b (W:1)"
    )


def test_the_last_holder_of_a_shard_nobody_serves_is_read_from_the_fleet() -> None:
    # given node a live holding W:0; node b gone holding W:1 and W:2, W:2 since taken
    # by a; an ownership item of W:3 still naming node c, which is gone too
    now, store = 1_000_000.0, MemoryStore()
    heartbeat(store, "a", now - 1, ("W:0", "W:2"))
    heartbeat(store, "b", now - 90, (), gone="lease expired", gone_at=now - 60)
    item = store.get("node/b")
    assert item is not None
    store.put("node/b", {**item.value, "held": ["W:1", "W:2"]}, version=item.version)
    heartbeat(store, "c", now - 900, ("W:3",))
    item = store.get("node/c")
    assert item is not None
    store.put(
        "node/c",
        {**item.value, "gone": "lease expired", "gone_at": now - 800},
        version=item.version,
    )
    view = fleet_view(read_fleet(store), now, {"W": 4})
    # then the shards nobody serves name the node that held them last, the others none
    assert view.unserved == ("W:1", "W:3")
    assert view.last_holder("W", 1) == "b" and view.last_holder("W", 3) == "c"
    assert view.last_holder("W", 0) is None and view.last_holder("W", 2) is None


def test_stats_and_nodes_name_the_gone_node_a_stuck_reshard_waits_for(
    resharding: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given n1 live holding SyncOrder's old shards 0, 2 and 3, and n2 gone that held shard 1
    now, store = time.time(), resharding.store
    heartbeat(store, "n1", now, ("SyncOrder:0", "SyncOrder:2", "SyncOrder:3"))
    heartbeat(store, "n2", now - 40, ("SyncOrder:1",))
    item = store.get("node/n2")
    assert item is not None
    gone = {**item.value, "gone": "lease expired", "gone_at": now - 20}
    store.put("node/n2", gone, version=item.version)
    # when the stats are read, then the move is stuck behind shard 1, last held by n2
    move = collect(resharding).to_dict()["by_worker"]["SyncOrder"]["layout"]["reshard"]
    assert move["unserved"] == [1] and move["last_held"] == {"1": "n2"}
    assert move["stuck"].startswith("1 old shard (SyncOrder:1) held by no node: ")
    assert move["stuck"].endswith("; last held by n2 (SyncOrder:1)")
    # and `shardq nodes` says the same
    assert _nodes(resharding, args(json=False)) == 0
    out = capsys.readouterr().out
    assert "STUCK: 1 old shard (SyncOrder:1) held by no node" in out, out
    assert out.rstrip().endswith("; last held by n2 (SyncOrder:1)"), out
