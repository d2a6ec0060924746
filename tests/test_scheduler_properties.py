"""Properties of the scheduler, over snapshots hypothesis makes up.

The example-based tests in test_scheduler.py measure shares and lags; these check
what must hold for every snapshot: a pick is a ready shard (None only when none is
ready), it has the largest lag of its level (ties to the one served longest ago), a
lone ready level always wins, and the same seed gives the same picks.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from shardq.core.scheduler import Scheduler, ShardView

priorities = st.sampled_from([1, 2, 3, 10, 99, 1000])
#: Few distinct lags and counters, so that ties are common.
lags = st.one_of(st.sampled_from([0.0, 0.5, 3.0]), st.floats(0, 1e6, allow_nan=False))
served = st.integers(0, 20)


@st.composite
def snapshots(draw: st.DrawFn, min_size: int = 0) -> list[ShardView[int]]:
    n = draw(st.integers(min_size, 24))
    return [
        ShardView(key, draw(priorities), draw(lags), draw(st.booleans()), draw(served))
        for key in range(n)
    ]


seeds = st.integers(0, 2**32 - 1)


@given(snapshots(), seeds)
def test_a_pick_is_a_ready_shard_and_none_only_when_no_shard_is_ready(
    shards: list[ShardView[int]], seed: int
) -> None:
    picked = Scheduler(random.Random(seed)).pick(shards)
    if any(v.ready for v in shards):
        assert picked is not None and picked in shards and picked.ready
    else:
        assert picked is None


@given(snapshots(min_size=1), seeds)
def test_the_pick_has_the_largest_lag_of_its_level_ties_to_the_least_recently_served(
    shards: list[ShardView[int]], seed: int
) -> None:
    picked = Scheduler(random.Random(seed)).pick(shards)
    if picked is None:
        return
    level = [v for v in shards if v.ready and v.priority == picked.priority]
    assert picked.lag == max(v.lag for v in level)
    tied = [v for v in level if v.lag == picked.lag]
    assert picked.last_served == min(v.last_served for v in tied)


@given(snapshots(min_size=1), priorities, seeds)
def test_a_lone_ready_level_always_wins(
    shards: list[ShardView[int]], level: int, seed: int
) -> None:
    # given a snapshot where only the shards of one level may be ready
    only = [
        ShardView(v.key, v.priority, v.lag, v.ready and v.priority == level, v.last_served)
        for v in shards
    ]
    only.append(ShardView(len(shards), level, 0.0, True, 0))  # at least one is ready
    scheduler = Scheduler(random.Random(seed))
    # then every pick, whatever the draws, is a ready shard of that level
    for _ in range(5):
        picked = scheduler.pick(only)
        assert picked is not None and picked.priority == level and picked.ready


@given(st.lists(snapshots(), min_size=1, max_size=5), seeds)
def test_the_same_seed_gives_the_same_picks(rounds: list[list[ShardView[int]]], seed: int) -> None:
    a, b = Scheduler(random.Random(seed)), Scheduler(random.Random(seed))
    assert [a.pick(s) for s in rounds] == [b.pick(s) for s in rounds]


@given(snapshots(), seeds, st.randoms(use_true_random=False))
def test_the_order_of_the_snapshot_does_not_change_the_pick(
    shards: list[ShardView[int]], seed: int, shuffler: random.Random
) -> None:
    # (when no two shards of a level tie on both lag and last served; a full tie
    # goes to the one listed first)
    keys = [(v.priority, v.lag, v.last_served) for v in shards if v.ready]
    if len(keys) != len(set(keys)):
        return
    shuffled = list(shards)
    shuffler.shuffle(shuffled)
    picked = Scheduler(random.Random(seed)).pick(shards)
    assert Scheduler(random.Random(seed)).pick(shuffled) == picked


@given(st.lists(priorities, min_size=1, unique=True), seeds)
def test_a_level_drawn_is_one_of_the_levels(levels: list[int], seed: int) -> None:
    assert Scheduler(random.Random(seed)).pick_level(sorted(levels)) in levels
