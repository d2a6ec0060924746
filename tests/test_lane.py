"""Which shard a lane serves next: the oldest head first, aged on the lane's wall clock."""

from __future__ import annotations

import random

from shardq.core.clock import ManualClock
from shardq.core.plan import ShardRef
from shardq.run.lane import Lane, shard_views
from shardq.run.shard import Shard


def shard(n: int, head_sent_at: float | None, priority: int = 1) -> Shard:
    s = Shard(ShardRef("W", n, priority), f"q-{n}", 30)
    s.head_sent_at = head_sent_at
    return s


def lane_on(clock: ManualClock) -> Lane:
    """A lane that is never started: only its choice is asked for."""
    return Lane(None, None, None, 0, [], random.Random(1), prefetch=1, wall_clock=clock)  # type: ignore[arg-type]


def test_a_shards_lag_is_the_age_of_its_head_on_the_given_wall_clock() -> None:
    # given shards whose oldest jobs were sent at 990 and 960, and one whose head is unknown
    shards = [shard(0, 990.0), shard(1, 960.0), shard(2, None)]
    # when the scheduler's view of them is taken at 1000
    views = shard_views(shards, 1_000.0)
    # then each lag is its head's age then, 0 when unknown
    assert [v.lag for v in views] == [10.0, 40.0, 0.0]


def test_a_lane_serves_the_shard_with_the_oldest_head_first_on_its_wall_clock() -> None:
    # given a lane on a wall clock at 1000, serving shards whose heads were sent at
    # 990 and 960 and one whose head is unknown
    clock = ManualClock(1_000.0)
    lane = lane_on(clock)
    a, b, c = shard(0, 990.0), shard(1, 960.0), shard(2, None)
    # when it picks, then it takes the oldest head first
    assert lane.pick([a, b, c]) is b
    # when b's next head was sent at 995 and the clock moved on 100 s
    b.head_sent_at = 995.0
    clock.advance(100)
    # then a's head (110 s old) goes before b's (105 s) and the unknown one
    assert lane.pick([a, b, c]) is a
    assert [v.lag for v in shard_views([a, b, c], clock())] == [110.0, 105.0, 0.0]


def test_among_heads_of_equal_age_the_shard_served_longest_ago_goes_first() -> None:
    # given a lane and two shards whose heads are equally old
    lane = lane_on(ManualClock(1_000.0))
    a, b = shard(0, 990.0), shard(1, 990.0)
    # when it picks twice, then each is served in turn
    first = lane.pick([a, b])
    second = lane.pick([a, b])
    assert {first, second} == {a, b}
