"""The fleet's decisions as pure functions of a store snapshot and an observer's clock."""

from __future__ import annotations

import pytest

from shardq.core.fleet_rules import (
    ELASTIC,
    STATIC,
    Beat,
    Owner,
    decide,
    expired,
    live_nodes,
    observe,
    timing,
    unreadable_owner,
)
from shardq.core.topology import parse_key

EXPIRE = 10.0


@pytest.mark.parametrize(
    ("lease", "beat", "expire"),
    [(10, 2.0, 6.0), (30, 6.0, 22.0), (600, 120.0, 478.0)],
)
def test_a_dead_node_is_seen_within_its_lease_and_a_live_one_beats_often_enough(
    lease: float, beat: float, expire: float
) -> None:
    # given a lease time, when the timing is derived
    got = timing(lease)
    # then a node beats several times per expiry, and a kill just after a beat is seen
    # (expire after the next round) and acted on (one more round) within the lease
    assert got == (beat, expire)
    assert got[1] >= 3 * got[0]
    assert got[0] + got[1] + 2 * 1.0 <= lease


def test_an_observer_keeps_the_time_it_first_saw_each_counter() -> None:
    # given a node seen at counter 3 since t=100, and another seen at 7 since 90
    seen = {"a": (3, 100.0), "b": (7, 90.0), "gone": (1, 50.0)}
    beats = {"a": Beat("a", 3), "b": Beat("b", 8), "new": Beat("new", 1)}
    # when the store is read again at t=105
    after = observe(seen, beats, 105.0)
    # then an unmoved counter keeps its time, a moved or new one is seen now, and a
    # node whose item disappeared is forgotten
    assert after == {"a": (3, 100.0), "b": (8, 105.0), "new": (1, 105.0)}


@pytest.mark.parametrize(
    ("first_seen", "now", "live"),
    [(100.0, 109.9, True), (100.0, 110.0, False), (100.0, 100.0, True)],
)
def test_a_node_is_live_until_its_counter_stood_still_for_the_expiry(
    first_seen: float, now: float, live: bool
) -> None:
    beats = {"a": Beat("a", 4)}
    seen = {"a": (4, first_seen)}
    assert ("a" in live_nodes(beats, seen, now, EXPIRE)) is live
    assert (expired(beats, seen, now, EXPIRE) == ["a"]) is not live


def test_static_nodes_and_nodes_marked_gone_are_not_live_members() -> None:
    beats = {
        "s": Beat("s", 1, mode=STATIC),
        "g": Beat("g", 9, mode=ELASTIC, gone="lease expired"),
        "e": Beat("e", 2),
    }
    seen = {n: (b.counter, 0.0) for n, b in beats.items()}
    # then only the elastic node not marked gone is live; a gone one is not marked again
    assert live_nodes(beats, seen, 1.0, EXPIRE) == {"e"}
    assert expired(beats, seen, 100.0, EXPIRE) == ["e", "s"]


def test_a_clock_skew_between_machines_does_not_matter() -> None:
    # given a node whose own wall clock is far off: nothing of its time is in a Beat,
    # only its counter; an observer that sees the counter move keeps it live
    seen: dict[str, tuple[int, float]] = {}
    for t, counter in [(0.0, 1), (5.0, 2), (10.0, 3), (15.0, 4)]:
        seen = observe(seen, {"far": Beat("far", counter)}, t)
        assert live_nodes({"far": Beat("far", counter)}, seen, t, EXPIRE) == {"far"}


def owners(**held: str) -> dict[str, Owner]:
    return {f"W:{k[1:]}": Owner(f"W:{k[1:]}", node, 3) for k, node in held.items()}


def test_a_lone_node_claims_every_free_shard() -> None:
    moves = decide("a", {"W": 3}, {"a"}, {}, set())
    assert moves.claim == {"W:0": None, "W:1": None, "W:2": None}
    assert not moves.free and not moves.lost and not moves.serve


def test_the_shards_of_a_dead_owner_are_claimed_on_the_version_read() -> None:
    # given b owned W:1 and W:2 and is no longer live
    moves = decide("a", {"W": 3}, {"a"}, owners(s0="a", s1="b", s2="b"), {"W:0"})
    # then a claims them on the versions it read, and keeps W:0
    assert moves.claim == {"W:1": 3, "W:2": 3}
    assert not moves.free


def test_a_node_over_its_fair_share_frees_shards_for_a_joiner() -> None:
    # given a holds all 4 shards and b joined
    held = owners(s0="a", s1="a", s2="a", s3="a")
    mine = decide("a", {"W": 4}, {"a", "b"}, held, {"W:0", "W:1", "W:2", "W:3"})
    theirs = decide("b", {"W": 4}, {"a", "b"}, held, set())
    # then a frees its two highest shards (draining first) and b claims nothing yet
    assert sorted(mine.free) == ["W:2", "W:3"] and not mine.claim
    assert not theirs.claim
    # when a freed them, b claims exactly those
    freed = {k: v for k, v in held.items() if k in ("W:0", "W:1")}
    assert decide("b", {"W": 4}, {"a", "b"}, freed, set()).claim == {"W:2": None, "W:3": None}


def test_a_node_stops_serving_a_shard_another_node_owns_and_leaves_busy_ones_alone() -> None:
    held = owners(s0="b", s1="a")
    moves = decide("a", {"W": 2}, {"a", "b"}, held, {"W:0", "W:1"})
    assert moves.lost == ("W:0",)
    # a shard draining (busy) is neither freed again nor claimed
    busy = decide("a", {"W": 2}, {"a"}, owners(s1="a"), {"W:1"}, busy={"W:0", "W:1"})
    assert not busy.claim and not busy.free and not busy.lost


def test_an_owned_shard_not_served_here_is_served_again() -> None:
    moves = decide("a", {"W": 1}, {"a"}, owners(s0="a"), set())
    assert moves.serve == ("W:0",) and not moves.claim


def test_ownership_items_of_an_ended_generation_are_purged_or_freed() -> None:
    # given W is now generation 1 (W@1, 2 shards); items of generation 0 remain
    items = {
        "W:0": Owner("W:0", "gone-node", 5),
        "W:1": Owner("W:1", "a", 2),
        "Other:0": Owner("Other:0", "gone-node", 1),
    }
    moves = decide("a", {"W@1": 2}, {"a"}, items, {"W:1"})
    # then a frees its own, purges the dead node's, and leaves unknown workers alone
    assert moves.free == {"W:1": 2}
    assert moves.purge == {"W:0": 5}
    assert moves.claim == {"W@1:0": None, "W@1:1": None}


def test_a_freed_shard_names_nobody_and_is_claimed_on_its_version() -> None:
    # given W:0 was freed (its item names nobody, at version 7)
    freed = {"W:0": Owner("W:0", "", 7)}
    # then the node it is meant for claims it on version 7, never as a new item
    assert decide("a", {"W": 1}, {"a"}, freed, set()).claim == {"W:0": 7}


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("Orders:3", ("Orders", 3)),
        ("Orders@2:0", ("Orders@2", 0)),
        ("ns:Orders:12", ("ns:Orders", 12)),
    ],
)
def test_a_shard_key_is_read_as_its_name_and_number(key: str, parsed: tuple[str, int]) -> None:
    # given a key as ShardRef.key writes it, when it is parsed, then name and number come back
    assert parse_key(key) == parsed


@pytest.mark.parametrize(
    "key",
    [
        "",
        "Orders",
        ":3",
        "Orders:",
        "Orders:-1",
        "Orders:+1",
        "Orders: 3",
        "Orders:\u0663",
        "Orders:03",
    ],
)
def test_a_damaged_shard_key_is_refused_naming_it(key: str) -> None:
    # given a key no shard ref writes, when it is parsed, then the error names it
    with pytest.raises(ValueError, match="is not 'name:shard'") as raised:
        parse_key(key)
    assert repr(key) in str(raised.value)


def test_a_damaged_ownership_item_is_ignored_by_the_balancer() -> None:
    # given an ownership item whose key is damaged, next to a sound one
    owners = {"Orders:x": Owner("Orders:x", "a", 1), "Orders:0": Owner("Orders:0", "a", 1)}
    # when this node decides, then it claims the shards of the layout and nothing else
    moves = decide("b", {"Orders": 2}, {"b"}, owners, set())
    assert set(moves.claim) == {"Orders:0", "Orders:1"}


def test_an_unreadable_ownership_item_belongs_to_its_holder_else_nobody_after_a_lease() -> None:
    # given heartbeats: this node b holds Orders:3, a live a holds Orders:0 and Orders:3
    # (stale), c holds Orders:1 but is not live
    held = {"a": {"Orders:0", "Orders:3"}, "b": {"Orders:3"}, "c": {"Orders:1"}}
    live = {"a", "b"}

    def owner(key: str, stood: float) -> str | None:
        return unreadable_owner(key, "b", held, live, stood, EXPIRE)

    # then this node's own holding wins, then a live holder's
    assert owner("Orders:3", 0.0) == "b"
    assert owner("Orders:0", 0.0) == "a"
    # and a shard no live node holds is left alone (None) until the item stood a lease
    assert owner("Orders:1", EXPIRE - 0.1) is None and owner("Orders:2", 0.0) is None
    assert owner("Orders:1", EXPIRE) == ""


def test_a_key_left_alone_is_never_purged_and_a_key_of_no_worker_is_never_freed() -> None:
    # given items naming this node a of a key that does not parse and of a worker the app
    # does not have, and a busy item of an ended generation whose owner is not live
    owners = {
        "garbage": Owner("garbage", "a", 1),
        "Nope:0": Owner("Nope:0", "a", 1),
        "Orders@1:0": Owner("Orders@1:0", "c", 4),
    }
    # when a decides on a layout of Orders@2
    moves = decide("a", {"Orders@2": 1}, {"a"}, owners, set(), busy={"Orders@1:0"})
    # then it frees, loses and purges nothing of them (freeing would need the worker)
    assert not moves.free and not moves.lost and not moves.purge
    # and without the busy mark the ended generation's item is purged, as before
    assert decide("a", {"Orders@2": 1}, {"a"}, owners, set()).purge == {"Orders@1:0": 4}
