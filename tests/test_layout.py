"""The live layout's pure rules (shardq.layout) on plain data, and the app's queue names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import shardq
from shardq import layout as rules
from shardq import reshard
from shardq.errors import ConfigError, LayoutError
from shardq.layout import LayoutDoc, Move, Retired, WorkerLayout
from shardq.limits import MAX_QUEUE_NAME_LENGTH
from shardq.sharding import shard_for

T0 = 1_700_000_000.0


def moving(
    old: int = 4, new: int = 8, closed: tuple[int, ...] = (), trust: float = 60.0
) -> WorkerLayout:
    """Generation 1 with ``new`` shards, moving from generation 0 with ``old``."""
    return WorkerLayout(1, new, T0, Move(0, old, T0, closed, "test", trust))


def entity_in(shard: int, shards: int) -> str:
    """An entity id whose shard among ``shards`` is ``shard``."""
    return next(e for e in (f"e{i}" for i in range(10_000)) if shard_for(e, shards) == shard)


# -- start --------------------------------------------------------------------------------
def test_start_begins_a_move_to_the_next_generation() -> None:
    # given a worker at its code's layout
    layout = WorkerLayout(0, 4)
    # when a reshard to 8 begins
    after = rules.start(layout, "Orders", 8, T0, "ops", trust=30.0)
    # then generation 1 has 8 shards and moves from generation 0's 4
    assert (after.gen, after.shards, after.since) == (1, 8, T0)
    assert after.moving == Move(0, 4, T0, (), "ops", 30.0)
    assert after.moving.left == [0, 1, 2, 3]


def test_start_refuses_a_second_reshard_while_one_runs() -> None:
    # given a reshard from 4 to 8 under way, one old shard closed
    layout = moving(4, 8, closed=(2,))
    # when another is asked for
    with pytest.raises(LayoutError) as caught:
        rules.start(layout, "Orders", 16, T0 + 5, "ops")
    # then it is refused, naming the running one's from and to and what is left
    message = str(caught.value)
    assert "a reshard of Orders from 4 to 8 shards is in progress" in message
    assert "3 of 4 old shards still open" in message
    assert "shardq stats" in message


def test_start_refuses_the_same_count() -> None:
    with pytest.raises(LayoutError, match="Orders already has 4 shards; nothing to do"):
        rules.start(WorkerLayout(0, 4), "Orders", 4, T0, "ops")


@pytest.mark.parametrize("shards", [0, 1001, -1, "8", 8.0, True, None])
def test_start_refuses_counts_out_of_range_or_not_int(shards: Any) -> None:
    with pytest.raises(LayoutError) as caught:
        rules.start(WorkerLayout(0, 4), "Orders", shards, T0, "ops")
    assert "--shards must be an int from 1 to 1000" in str(caught.value)
    assert repr(shards) in str(caught.value)


def test_the_next_generation_comes_after_retired_ones() -> None:
    # given generation 3 current, generation 5 retired (numbers never go back)
    layout = WorkerLayout(3, 8, T0, None, (Retired(5, 2, T0),))
    # when a reshard begins
    after = rules.start(layout, "Orders", 4, T0 + 1, "ops")
    # then its generation is 6, moving from 3
    assert after.gen == 6 and after.moving is not None and after.moving.gen == 3


# -- close and deleted --------------------------------------------------------------------
def test_close_keeps_the_move_until_its_last_shard() -> None:
    # given a move from 2 shards
    layout = moving(2, 4, trust=30.0)
    # when shard 0 closes, then again (closing twice changes nothing)
    one = rules.close(layout, 0, T0 + 40)
    assert rules.close(one, 0, T0 + 41) == one
    # then the move goes on with shard 1 left
    assert one.moving is not None and one.moving.closed == (0,) and one.moving.left == [1]
    assert one.retired == ()


def test_close_ends_the_move_at_the_last_shard_and_retires_it_with_twice_the_trust() -> None:
    # given a move from 2 shards with a 30 s trust window, shard 0 closed
    layout = rules.close(moving(2, 4, trust=30.0), 0, T0 + 40)
    # when shard 1 closes
    after = rules.close(layout, 1, T0 + 50)
    # then the move is over and generation 0 retired, its queues deleted after 60 s
    assert after.moving is None
    assert after.retired == (Retired(0, 2, T0 + 50, (), 60.0),)
    assert (after.gen, after.shards) == (1, 4)
    # and closing without a move changes nothing
    assert rules.close(after, 0, T0 + 60) == after


def test_deleted_drops_a_retired_generation_once_all_its_queues_are_gone() -> None:
    # given generation 0 retired with 2 queues
    layout = WorkerLayout(1, 4, T0, None, (Retired(0, 2, T0 + 50, (), 120.0),))
    # when queue 1 is deleted
    one = rules.deleted(layout, 0, 1)
    # then generation 0 is still served, for queue 0 only
    assert one.retired == (Retired(0, 2, T0 + 50, (1,), 120.0),)
    assert one.served(0) == [0]
    assert one.generations() == {1: 4, 0: 2}
    # and when queue 0 is deleted too, the generation is gone
    both = rules.deleted(one, 0, 0)
    assert both.retired == ()
    assert both.generations() == {1: 4}


# -- route --------------------------------------------------------------------------------
def test_route_a_new_job_waits_while_its_entitys_old_shard_is_open() -> None:
    # given a move from 4 to 8 shards, old shard 1 closed
    layout = moving(4, 8, closed=(1,))
    waiting, running = entity_in(0, 4), entity_in(1, 4)
    # then a job of the current generation waits if its entity's old shard is open
    assert rules.route(layout, 1, shard_for(waiting, 8), waiting) == rules.WAIT
    # and runs once that old shard is closed
    assert rules.route(layout, 1, shard_for(running, 8), running) == rules.RUN


def test_route_an_old_job_runs_while_its_shard_is_open_and_is_relayed_once_closed() -> None:
    layout = moving(4, 8, closed=(1,))
    assert rules.route(layout, 0, 0, entity_in(0, 4)) == rules.RUN
    assert rules.route(layout, 0, 1, entity_in(1, 4)) == rules.RELAY


def test_route_a_job_of_a_retired_generation_is_relayed() -> None:
    layout = WorkerLayout(2, 8, T0, None, (Retired(1, 4, T0),))
    assert rules.route(layout, 1, 3, "e1") == rules.RELAY
    assert rules.route(layout, 0, 3, "e1") == rules.RELAY


def test_route_a_job_of_a_generation_newer_than_the_copy_waits() -> None:
    # given a copy of the document that does not know generation 2 yet
    layout = WorkerLayout(1, 8, T0)
    # then a job from generation 2 waits (the copy is looked at again)
    assert rules.route(layout, 2, 0, "e1") == rules.WAIT
    # and a job of the current generation without a move runs
    assert rules.route(layout, 1, 0, "e1") == rules.RUN


# -- may_close, may_delete ----------------------------------------------------------------
def test_may_close_only_after_the_switch_and_its_margin_and_only_open_old_shards() -> None:
    layout = moving(4, 8, closed=(1,), trust=30.0)
    after = T0 + 30 + rules.SWITCH_MARGIN_SECONDS
    # before the switch time plus its margin nothing may close
    assert not rules.may_close(layout, 0, 0, after - 0.1)
    # after it, an open old shard may
    assert rules.may_close(layout, 0, 0, after)
    # but not one closed already, nor a shard of the new generation
    assert not rules.may_close(layout, 0, 1, after)
    assert not rules.may_close(layout, 1, 0, after)
    # and nothing without a move
    assert not rules.may_close(WorkerLayout(1, 8), 0, 0, T0 + 1000)


def test_publishers_send_to_the_old_layout_until_the_switch_time_then_to_the_new() -> None:
    layout = moving(4, 8, trust=30.0)
    assert rules.publish_to(layout, T0) == (0, 4)
    assert rules.publish_to(layout, T0 + 29.9) == (0, 4)
    assert rules.publish_to(layout, T0 + 30) == (1, 8)
    assert rules.publish_to(WorkerLayout(3, 5), T0) == (3, 5)


def test_may_delete_only_after_the_grace_and_only_retired_queues_left() -> None:
    layout = WorkerLayout(1, 8, T0, None, (Retired(0, 4, T0 + 100, (2,), 60.0),))
    assert not rules.may_delete(layout, 0, 0, T0 + 159.9)
    assert rules.may_delete(layout, 0, 0, T0 + 160)
    assert not rules.may_delete(layout, 0, 2, T0 + 160)  # deleted already
    assert not rules.may_delete(layout, 1, 0, T0 + 1000)  # the current generation


# -- the document -------------------------------------------------------------------------
def full_doc() -> LayoutDoc:
    return LayoutDoc(
        version=7,
        written=T0 + 9,
        workers={
            "Orders": moving(4, 8, closed=(0, 3), trust=45.0),
            "Invoices": WorkerLayout(3, 2, T0, None, (Retired(2, 5, T0 + 1, (1, 4), 90.0),)),
        },
    )


def test_the_document_round_trips_through_its_text() -> None:
    doc = full_doc()
    assert LayoutDoc.from_text(doc.to_text()) == doc


def test_a_document_of_a_newer_format_is_refused_saying_to_upgrade() -> None:
    data = json.loads(full_doc().to_text())
    data["format"] = rules.FORMAT + 1
    with pytest.raises(LayoutError, match=r"newer than this shardq reads.*upgrade shardq"):
        LayoutDoc.from_text(json.dumps(data))


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: "{not json", "is not JSON"),
        (lambda d: "[]", "the layout document in the layout document is not an object"),
        (lambda d: json.dumps({**d, "format": None}), "has no format number"),
        (lambda d: json.dumps({**d, "version": "7"}), "'version' in the layout document"),
        (lambda d: json.dumps({**d, "workers": []}), "workers in the layout document is not"),
        (
            lambda d: json.dumps(
                {**d, "workers": {"Orders": {**d["workers"]["Orders"], "shards": 0}}}
            ),
            "Orders: shards 0 in the layout document is not 1..1000",
        ),
        (
            lambda d: json.dumps(
                {**d, "workers": {"Orders": {**d["workers"]["Orders"], "moving": {"gen": 0}}}}
            ),
            "Orders: 'shards' in the layout document is not an int",
        ),
        (
            lambda d: json.dumps(
                {
                    **d,
                    "workers": {
                        "Orders": {
                            **d["workers"]["Orders"],
                            "moving": {**d["workers"]["Orders"]["moving"], "closed": [1, "2"]},
                        }
                    },
                }
            ),
            "Orders: 'closed' in the layout document is not a list of ints",
        ),
        (
            lambda d: json.dumps(
                {**d, "workers": {"Invoices": {**d["workers"]["Invoices"], "retired": [3]}}}
            ),
            "worker Invoices's retired generation in the layout document is not an object",
        ),
        (
            lambda d: json.dumps({**d, "written": "soon"}),
            "'written' in the layout document is not a number",
        ),
    ],
)
def test_a_damaged_document_is_refused_naming_the_problem(damage: Any, named: str) -> None:
    data = json.loads(full_doc().to_text())
    with pytest.raises(LayoutError) as caught:
        LayoutDoc.from_text(damage(data))
    assert named in str(caught.value)


def test_unknown_fields_are_ignored() -> None:
    # given a document with fields this shardq does not know, at every level
    data = json.loads(full_doc().to_text())
    data["comment"] = "hello"
    data["workers"]["Orders"]["owner"] = "team-a"
    data["workers"]["Orders"]["moving"]["note"] = 1
    data["workers"]["Invoices"]["retired"][0]["extra"] = [1]
    # then it reads as the same document
    assert LayoutDoc.from_text(json.dumps(data)) == full_doc()


def test_shard_names_and_their_parsing() -> None:
    assert rules.shard_name("Orders", 0) == "Orders"
    assert rules.shard_name("Orders", 2) == "Orders@2"
    assert rules.parse_name("Orders@2") == ("Orders", 2)
    assert rules.parse_name("Orders") == ("Orders", 0)
    for bad in ("Orders@", "@2", "Orders@x"):
        with pytest.raises(ConfigError, match="is not a worker name with a generation"):
            rules.parse_name(bad)


def test_current_is_the_documents_layout_else_the_codes() -> None:
    doc = full_doc()
    assert rules.current(doc, "Orders", 4) == doc.workers["Orders"]
    assert rules.current(doc, "Other", 5) == WorkerLayout(0, 5)
    assert rules.current(None, "Orders", 4) == WorkerLayout(0, 4)


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
    app.layouts.update("Orders", lambda w: rules.start(w, "Orders", 8, T0, "test"))
    # then both the old and the new generation are served
    assert app.live_shards("Orders") == {"Orders": 4, "Orders@1": 8}
    # and once every old shard closed, only the new one
    for shard in range(4):
        app.layouts.update("Orders", lambda w, s=shard: rules.close(w, s, T0 + 99))
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
        assert app.layouts.get("Long", max_age=0).gen == 9
    finally:
        broker.close()
