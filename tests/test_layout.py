"""The live layout's pure rules (shardq.core.layout) on plain data, the layout item's
round trip, and the app's queue names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import shardq
from shardq.core import layout as rules
from shardq.core import topology
from shardq.core.errors import ConfigError, LayoutError
from shardq.core.layout import Move, Retired, WorkerLayout
from shardq.core.limits import MAX_QUEUE_NAME_LENGTH
from shardq.core.topology import shard_for
from shardq.ops import reshard


def moving(
    old: int = 4, new: int = 8, closed: tuple[int, ...] = (), switched: bool = True
) -> WorkerLayout:
    """Generation 1 with ``new`` shards, moving from generation 0 with ``old``."""
    return WorkerLayout(1, new, 60.0, Move(0, old, switched, closed, "test"))


def entity_in(shard: int, shards: int) -> str:
    """An entity id whose shard among ``shards`` is ``shard``."""
    return next(e for e in (f"e{i}" for i in range(10_000)) if shard_for(e, shards) == shard)


# -- transitions --------------------------------------------------------------------------
def test_announce_begins_a_move_to_the_next_generation_keeping_the_longer_trust() -> None:
    after = rules.announce(WorkerLayout(0, 4, 90.0), "Orders", 8, 60.0, "me")
    assert after == WorkerLayout(1, 8, 90.0, Move(0, 4, False, (), "me"))
    assert after.state == "announced"
    assert rules.announce(WorkerLayout(0, 4, 30.0), "Orders", 8, 60.0).trust == 60.0


@pytest.mark.parametrize(
    ("layout", "shards", "refused"),
    [
        (moving(), 16, "from 4 to 8 shards is in progress (4 of 4 old shards still open)"),
        (WorkerLayout(0, 4), 4, "already has 4 shards; nothing to do"),
        (WorkerLayout(0, 4), 0, "--shards must be an int from 1 to 1000, got 0"),
        (WorkerLayout(0, 4), 1001, "got 1001"),
        (WorkerLayout(0, 4), True, "got True"),
        (WorkerLayout(0, 4), "8", "got '8'"),
    ],
)
def test_announce_refuses_naming_why(layout: WorkerLayout, shards: Any, refused: str) -> None:
    with pytest.raises(LayoutError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        rules.announce(layout, "Orders", shards, 60.0)


def test_the_next_generation_comes_after_retired_ones() -> None:
    layout = WorkerLayout(2, 8, retired=(Retired(3, 4),))
    assert rules.announce(layout, "Orders", 5, 60.0).gen == 4


@pytest.mark.parametrize(
    ("before", "change", "after"),
    [
        # the switch: once, only for the generation announced
        (moving(switched=False), lambda w: rules.switch(w, 1), moving()),
        (moving(switched=False), lambda w: rules.switch(w, 2), moving(switched=False)),
        (moving(), lambda w: rules.switch(w, 1), moving()),
        # a close: only once switched, only the old generation, the last one retires it
        (moving(switched=False), lambda w: rules.close(w, 0, 1), moving(switched=False)),
        (moving(), lambda w: rules.close(w, 1, 1), moving()),
        (moving(), lambda w: rules.close(w, 0, 1), moving(closed=(1,))),
        (moving(closed=(1,)), lambda w: rules.close(w, 0, 1), moving(closed=(1,))),
        (
            moving(closed=(0, 1, 2)),
            lambda w: rules.close(w, 0, 3),
            WorkerLayout(1, 8, 60.0, None, (Retired(0, 4),)),
        ),
        # a deletion: recorded; the last one drops the retired generation
        (
            WorkerLayout(1, 8, retired=(Retired(0, 2),)),
            lambda w: rules.deleted(w, 0, 1),
            WorkerLayout(1, 8, retired=(Retired(0, 2, (1,)),)),
        ),
        (
            WorkerLayout(1, 8, retired=(Retired(0, 2, (1,)),)),
            lambda w: rules.deleted(w, 0, 0),
            WorkerLayout(1, 8),
        ),
    ],
)
def test_transitions(before: WorkerLayout, change: Any, after: WorkerLayout) -> None:
    assert change(before) == after


# -- decisions ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "observed", "now", "may"),
    [
        (moving(switched=False), 100.0, 159.9, False),
        (moving(switched=False), 100.0, 160.0, True),
        (moving(), 100.0, 500.0, False),  # switched already
        (WorkerLayout(0, 4), 100.0, 500.0, False),
    ],
)
def test_may_switch_once_trust_passed_since_observed(
    layout: WorkerLayout, observed: float, now: float, may: bool
) -> None:
    assert rules.may_switch(layout, observed, now) is may


@pytest.mark.parametrize(
    ("layout", "gen", "shard", "now", "may"),
    [
        (moving(), 0, 1, 164.9, False),  # trust + margin not passed since observed
        (moving(), 0, 1, 165.0, True),
        (moving(switched=False), 0, 1, 999.0, False),  # not switched
        (moving(closed=(1,)), 0, 1, 999.0, False),  # closed already
        (moving(), 1, 1, 999.0, False),  # the new generation
        (WorkerLayout(0, 4), 0, 1, 999.0, False),  # no move
    ],
)
def test_may_close_only_trust_and_margin_after_the_switch_was_observed(
    layout: WorkerLayout, gen: int, shard: int, now: float, may: bool
) -> None:
    assert rules.may_close(layout, gen, shard, 100.0, now) is may


def test_may_delete_a_retired_queue_twice_the_trust_after_observed() -> None:
    assert not rules.may_delete(100.0, 219.9, 60.0)
    assert rules.may_delete(100.0, 220.0, 60.0)


def test_route_a_new_job_waits_while_its_entitys_old_shard_is_open() -> None:
    entity = entity_in(2, 4)
    assert rules.route(moving(), 1, shard_for(entity, 8), entity) == rules.WAIT
    assert rules.route(moving(closed=(2,)), 1, shard_for(entity, 8), entity) == rules.RUN


def test_route_an_old_job_runs_while_its_shard_is_open_and_is_relayed_once_closed() -> None:
    assert rules.route(moving(), 0, 2, "x") == rules.RUN
    assert rules.route(moving(closed=(2,)), 0, 2, "x") == rules.RELAY


def test_route_a_retired_or_unknown_generation() -> None:
    assert rules.route(WorkerLayout(1, 8, retired=(Retired(0, 4),)), 0, 1, "x") == rules.RELAY
    assert rules.route(WorkerLayout(0, 4), 1, 1, "x") == rules.WAIT  # newer than the copy
    assert rules.route(WorkerLayout(0, 4), 0, 1, "x") == rules.RUN


def test_publishers_send_to_the_old_layout_until_switched() -> None:
    assert rules.publish_to(moving(switched=False)) == (0, 4)
    assert rules.publish_to(moving()) == (1, 8)
    assert rules.publish_to(WorkerLayout(0, 4)) == (0, 4)


# -- the item -----------------------------------------------------------------------------
def test_the_item_round_trips() -> None:
    for layout in [
        WorkerLayout(0, 4),
        moving(closed=(1, 3), switched=True),
        WorkerLayout(3, 5, 90.0, Move(2, 7), (Retired(1, 2, (0,)),)),
    ]:
        assert WorkerLayout.from_value("Orders", layout.to_value()) == layout


@pytest.mark.parametrize(
    "damage",
    [
        {"gen": -1},
        {"shards": 0},
        {"shards": "8"},
        {"trust": 0},
        {"trust": True},
        {"moving": {"gen": 0}},
        {"retired": [{}]},
        # old generations that are not older than the live one, or named twice: a node
        # would sweep (relay, then delete) the live queues
        {"moving": {"gen": 1, "shards": 4, "switched": True, "closed": []}},
        {"retired": [{"gen": 1, "shards": 2, "deleted": []}]},
        {"retired": [{"gen": 0, "shards": 2, "deleted": []}]},
        {"moving": {"gen": 0, "shards": 4, "switched": "yes", "closed": []}},
        {"moving": {"gen": 0, "shards": 4, "switched": True, "closed": [4]}},
        {"gen": 2, "retired": [{"gen": 1, "shards": 2, "deleted": "01"}]},
    ],
)
def test_a_damaged_item_is_refused_naming_the_worker_and_the_key(damage: dict[str, Any]) -> None:
    value = {**moving().to_value(), **damage}
    with pytest.raises(LayoutError, match=r"stored layout of Orders is damaged .* layout/Orders"):
        WorkerLayout.from_value("Orders", value)


def test_shard_names_and_their_parsing() -> None:
    assert topology.shard_name("Orders", 0) == "Orders"
    assert topology.shard_name("Orders", 2) == "Orders@2"
    assert topology.parse_name("Orders@2") == ("Orders", 2)
    assert topology.parse_name("Orders") == ("Orders", 0)
    with pytest.raises(ConfigError, match="not a worker name with a generation"):
        topology.parse_name("Orders@x")


# -- the app's queue names ----------------------------------------------------------------
def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


def define(name: str, **attrs: Any) -> type[shardq.Worker]:
    return type(name, (shardq.Worker,), {"perform": _perform, **attrs})


@pytest.fixture
def app() -> Iterator[shardq.App]:
    broker = shardq.MemoryBroker()
    app = shardq.App(shardq.Config(queue_prefix="prod-"), broker=broker)
    app.register(define("Orders", shards=4))
    try:
        yield app
    finally:
        broker.close()


def test_shard_queues_of_generation_0_keep_their_names_and_later_ones_add_theirs(
    app: shardq.App,
) -> None:
    assert app.shard_queue("Orders", 3) == "prod-orders-3.fifo"
    assert app.shard_queue("Orders", 3, 0) == "prod-orders-3.fifo"
    assert app.shard_queue("Orders", 3, 2) == "prod-orders-g2-3.fifo"


def test_live_shards_during_a_move_are_both_generations(app: shardq.App) -> None:
    # given no reshard yet: the code's layout
    assert app.live_shards("Orders") == {"Orders": 4}
    # when a reshard to 8 begins
    layout = app.layouts.update("Orders", lambda w: rules.announce(w, "Orders", 8, 60.0))
    # then both the old and the new generation are served
    assert app.live_shards("Orders") == {"Orders": 4, "Orders@1": 8}
    # and once every old shard closed, only the new one
    app.layouts.update("Orders", lambda w: rules.switch(w, layout.gen))
    for shard in range(4):
        app.layouts.update("Orders", lambda w, s=shard: rules.close(w, 0, s))
    assert app.live_shards("Orders") == {"Orders@1": 8}


@pytest.mark.parametrize(("extra", "refused"), [(0, False), (1, True)])
def test_a_reshard_whose_new_queue_names_pass_80_is_refused_before_anything_is_made(
    extra: int, refused: bool
) -> None:
    # given a worker at layout generation 9, with a prefix and queue name whose
    # generation-10 queue for shard 999 is 80 (+ extra) long (its morgue queue is shorter)
    prefix, tail = "p-", "-g10-999.fifo"
    name = "q" * (MAX_QUEUE_NAME_LENGTH - len(prefix) - len(tail) + extra)
    broker = shardq.MemoryBroker()
    app = shardq.App(shardq.Config(queue_prefix=prefix), broker=broker)
    app.register(define("Long", queue_name=name))
    try:
        app.check()  # the code's own queues are fine
        app.layouts.update("Long", lambda w: WorkerLayout(9, w.shards))
        if not refused:
            reshard.start(app, "Long", 1000)  # then exactly 80 passes
            return
        # when a reshard to 1000 shards is asked for, then it is refused, naming the
        # longest queue and the limit, and no layout was recorded
        with pytest.raises(LayoutError) as caught:
            reshard.start(app, "Long", 1000)
        assert f"{prefix}{name}{tail} (81 characters)" in str(caught.value)
        assert f"SQS allows {MAX_QUEUE_NAME_LENGTH}" in str(caught.value)
        assert app.layouts.read("Long").gen == 9
    finally:
        broker.close()
