"""The scheduler: a lottery across priority levels, then the laggiest shard of the level.

The scheduler is pure (no broker, no clock, no threads), so these tests feed it plain
snapshots and a seeded :class:`random.Random`; every figure below is deterministic.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Sequence

import pytest

from shardq.core.scheduler import Scheduler, ShardView

#: Relative tolerance of a level's share of picks against its share of tickets.
TOLERANCE = 0.05


def backlogged_levels(
    priorities: Sequence[int], shards_per_level: int, rng: random.Random
) -> list[ShardView[str]]:
    """Every shard of every level ready, with assorted lags and last-served counters."""
    return [
        ShardView(
            key=f"p{priority}-s{shard}",
            priority=priority,
            lag=rng.uniform(0, 30),
            ready=True,
            last_served=rng.randrange(1000),
        )
        for priority in priorities
        for shard in range(shards_per_level)
    ]


def level_shares(scheduler: Scheduler, shards: list[ShardView[str]], picks: int) -> Counter[int]:
    """How many of ``picks`` picks went to each priority level."""
    wins: Counter[int] = Counter()
    for _ in range(picks):
        view = scheduler.pick(shards)
        assert view is not None
        wins[view.priority] += 1
    return wins


def assert_shares_match_tickets(wins: Counter[int], tickets: Sequence[int]) -> None:
    picks = sum(wins.values())
    total = sum(tickets)
    report = {
        level: f"{wins[level] / picks:.4%} of picks vs {level / total:.4%} of tickets"
        for level in tickets
    }
    for level in tickets:
        expected = level / total
        share = wins[level] / picks
        assert abs(share - expected) <= TOLERANCE * expected, (
            f"level {level} off by more than {TOLERANCE:.0%} (relative): {report}"
        )


# -- lottery across levels -------------------------------------------------------------


def test_each_backlogged_level_gets_its_ticket_share() -> None:
    # given four levels with priorities 1, 3, 10 and 86 (the 1 holds 1 % of the
    # tickets), eight shards each, every shard ready
    rng = random.Random(20240501)
    priorities = [1, 3, 10, 86]
    shards = backlogged_levels(priorities, shards_per_level=8, rng=rng)
    scheduler = Scheduler(random.Random(7))

    # when the scheduler picks 200,000 times
    wins = level_shares(scheduler, shards, picks=200_000)

    # then each level's share of picks is within 5 % (relative) of its ticket share
    assert_shares_match_tickets(wins, priorities)


def test_a_one_percent_level_still_runs_beside_a_ninety_nine_percent_level() -> None:
    # given a level with priority 1 beside a level with priority 99, both backlogged
    rng = random.Random(99)
    priorities = [1, 99]
    shards = backlogged_levels(priorities, shards_per_level=8, rng=rng)
    scheduler = Scheduler(random.Random(11))

    # when the scheduler picks 200,000 times
    wins = level_shares(scheduler, shards, picks=200_000)

    # then the low level is not starved: it wins about 1 % of the picks
    assert wins[1] > 0
    assert_shares_match_tickets(wins, priorities)


def test_the_order_of_the_snapshot_does_not_matter() -> None:
    # given the same backlogged shards listed in two different orders
    shards = backlogged_levels([1, 3, 10, 86], shards_per_level=4, rng=random.Random(5))
    shuffled = list(shards)
    random.Random(6).shuffle(shuffled)

    # when two schedulers with the same seed pick from each
    a, b = Scheduler(random.Random(3)), Scheduler(random.Random(3))
    first = [a.pick(shards) for _ in range(2_000)]
    second = [b.pick(shuffled) for _ in range(2_000)]

    # then they pick the same shards
    assert first == second


# -- known-empty levels ----------------------------------------------------------------


class CountingRandom(random.Random):
    """A seeded Random that counts the draws made from it."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return super().random()


def with_empty_levels(shards: list[ShardView[str]], empty: set[int]) -> list[ShardView[str]]:
    """The same shards, with every shard of the ``empty`` levels known to be empty."""
    return [
        ShardView(v.key, v.priority, v.lag, v.priority not in empty, v.last_served) for v in shards
    ]


def test_a_level_known_to_be_empty_never_wins_and_costs_no_draw() -> None:
    # given levels 1, 3, 10 and 86 where every shard of levels 3 and 86 is known to
    # be empty (the 86 would otherwise win most draws)
    priorities = [1, 3, 10, 86]
    backlogged = backlogged_levels(priorities, shards_per_level=8, rng=random.Random(8))
    shards = with_empty_levels(backlogged, empty={3, 86})
    ready_only = [v for v in shards if v.ready]
    rng = CountingRandom(13)
    scheduler = Scheduler(rng)
    picks = 100_000

    # when the scheduler picks 100,000 times
    wins = level_shares(scheduler, shards, picks=picks)

    # then every pick is a ready shard of level 1 or 10, one draw per pick ...
    assert set(wins) == {1, 10}
    assert rng.draws == picks
    # ... the shares renormalise over the ready levels (1/11 and 10/11) ...
    assert_shares_match_tickets(wins, [1, 10])
    # ... and the picks are exactly those of a snapshot without the empty levels at all
    with_empty = Scheduler(random.Random(21))
    without = Scheduler(random.Random(21))
    assert [with_empty.pick(shards) for _ in range(5_000)] == [
        without.pick(ready_only) for _ in range(5_000)
    ]


def test_a_single_ready_level_always_wins() -> None:
    # given four levels of which only level 3 has a ready shard
    shards = with_empty_levels(
        backlogged_levels([1, 3, 10, 86], shards_per_level=4, rng=random.Random(4)),
        empty={1, 10, 86},
    )
    rng = CountingRandom(1)
    scheduler = Scheduler(rng)

    # when the scheduler picks 100 times
    picked = [scheduler.pick(shards) for _ in range(100)]

    # then level 3 always wins, with no more than one draw per pick
    assert all(v is not None and v.priority == 3 and v.ready for v in picked)
    assert rng.draws <= len(picked)


@pytest.mark.parametrize(
    "shards",
    [
        pytest.param([], id="no shards"),
        pytest.param(
            [ShardView("a", 1, 0.0, False), ShardView("b", 5, 12.0, False, 3)],
            id="all known empty",
        ),
    ],
)
def test_pick_returns_none_when_no_shard_is_ready(shards: list[ShardView[str]]) -> None:
    # given a snapshot with no shard known to have work
    scheduler = Scheduler(random.Random(0))
    # when the scheduler picks
    picked = scheduler.pick(shards)
    # then there is nothing to serve
    assert picked is None


# -- lag picker inside a level ---------------------------------------------------------


def test_the_shard_with_the_largest_lag_wins_its_level() -> None:
    # given one level whose shards have waited 1.5, 9.0 and 4.0 seconds, the laggiest
    # served most recently, and a shard known to be empty with a stale, larger lag
    shards = [
        ShardView("a", 5, lag=1.5, ready=True, last_served=1),
        ShardView("b", 5, lag=9.0, ready=True, last_served=50),
        ShardView("c", 5, lag=4.0, ready=True, last_served=2),
        ShardView("empty", 5, lag=60.0, ready=False, last_served=0),
    ]
    scheduler = Scheduler(random.Random(0))

    # when the scheduler picks
    picked = scheduler.pick(shards)

    # then the ready shard with the largest lag is served
    assert picked is not None
    assert picked.key == "b"


def test_a_lag_tie_goes_to_the_shard_served_longest_ago() -> None:
    # given three shards of one level with the same lag, last served at 40, 7 and 19
    shards = [
        ShardView("recent", 2, lag=3.0, ready=True, last_served=40),
        ShardView("oldest", 2, lag=3.0, ready=True, last_served=7),
        ShardView("middle", 2, lag=3.0, ready=True, last_served=19),
        ShardView("behind", 2, lag=2.0, ready=True, last_served=0),
    ]
    scheduler = Scheduler(random.Random(0))

    # when the scheduler picks (and picks again from a reordered snapshot)
    picked = scheduler.pick(shards)
    again = scheduler.pick(list(reversed(shards)))

    # then the shard served longest ago among the laggiest wins, whatever the order
    assert picked is not None and again is not None
    assert picked.key == again.key == "oldest"


def test_unknown_lag_shards_are_still_served_in_turn() -> None:
    # given shards whose lag is unknown (0) but known to have work
    shards = [
        ShardView(k, 1, lag=0.0, ready=True, last_served=s)
        for k, s in [("x", 5), ("y", 2), ("z", 9)]
    ]
    scheduler = Scheduler(random.Random(0))

    # when the scheduler picks
    picked = scheduler.pick(shards)

    # then the one served longest ago goes first
    assert picked is not None
    assert picked.key == "y"


# -- lag picker against round-robin: a discrete-time simulation ------------------------

#: Jobs the hot shard receives every tick.
HOT_RATE = 6
#: The cold shards: one job every ``period`` ticks, staggered by their index.
COLD_PERIODS = (5, 6, 7, 8, 9, 5, 7)
#: Jobs the thread takes from the shard it serves in one tick (a full SQS receive).
BATCH = 10
TICKS = 5_000

#: A picker: (queues of arrival ticks, tick each shard was last served, now) -> shard.
Picker = Callable[[list[deque[int]], list[int], int], "int | None"]


def simulate(pick: Picker) -> tuple[int, float, list[int]]:
    """One thread serving one level of shards for TICKS ticks.

    Each tick: jobs arrive, the picker chooses one shard, the thread takes up to
    BATCH of its oldest jobs, and the age of the oldest job still waiting anywhere is
    sampled. Returns the largest and the mean sampled age and the final backlogs.
    """
    queues: list[deque[int]] = [deque() for _ in range(1 + len(COLD_PERIODS))]
    last_served = [0] * len(queues)
    ages = []
    for now in range(TICKS):
        queues[0].extend([now] * HOT_RATE)
        for shard, period in enumerate(COLD_PERIODS, start=1):
            if (now + shard) % period == 0:
                queues[shard].append(now)
        shard = pick(queues, last_served, now)
        if shard is not None:
            queue = queues[shard]
            for _ in range(min(BATCH, len(queue))):
                queue.popleft()
            last_served[shard] = now + 1
        ages.append(max((now - q[0]) if q else 0 for q in queues))
    return max(ages), sum(ages) / len(ages), [len(q) for q in queues]


def lag_picker(scheduler: Scheduler) -> Picker:
    """The scheduler under test, fed a snapshot built from the queues."""

    def pick(queues: list[deque[int]], last_served: list[int], now: int) -> int | None:
        view = scheduler.pick(
            [
                ShardView(
                    key=shard,
                    priority=1,
                    lag=float(now - queue[0]) if queue else 0.0,
                    ready=bool(queue),
                    last_served=last_served[shard],
                )
                for shard, queue in enumerate(queues)
            ]
        )
        return None if view is None else view.key

    return pick


def round_robin() -> Picker:
    """The baseline: the next shard after the last one served that has work."""
    previous = -1

    def pick(queues: list[deque[int]], last_served: list[int], now: int) -> int | None:
        nonlocal previous
        for step in range(1, len(queues) + 1):
            shard = (previous + step) % len(queues)
            if queues[shard]:
                previous = shard
                return shard
        return None

    return pick


def test_the_load_fits_the_thread_but_not_a_round_robin_share_of_it() -> None:
    # given the simulated load: under the thread's capacity of BATCH jobs per tick in
    # total, but the hot shard alone needs more than 1/8 of the ticks round-robin
    # gives it once every cold shard has a job waiting
    total_rate = HOT_RATE + sum(1 / period for period in COLD_PERIODS)
    hot_ticks_needed = HOT_RATE / BATCH
    round_robin_share = 1 / (1 + len(COLD_PERIODS))
    # then (sanity of the scenario below)
    assert total_rate < BATCH
    assert hot_ticks_needed > round_robin_share


def test_the_lag_picker_keeps_the_oldest_job_younger_than_round_robin() -> None:
    # given one level with a hot shard (6 jobs a tick) and seven cold shards (a job
    # every 5 to 9 ticks), served by one thread taking up to 10 jobs a tick
    scheduler = Scheduler(random.Random(42))

    # when the same arrivals are served for 5,000 ticks by the lag picker and by
    # round-robin over the shards with work
    lag_max, lag_mean, lag_backlog = simulate(lag_picker(scheduler))
    rr_max, rr_mean, rr_backlog = simulate(round_robin())

    # then the oldest waiting job is younger with the lag picker, at worst and on average
    figures = (
        f"oldest waiting job age (ticks): lag picker max {lag_max} mean {lag_mean:.1f} "
        f"(final backlogs {lag_backlog}); round-robin max {rr_max} mean {rr_mean:.1f} "
        f"(final backlogs {rr_backlog})"
    )
    print(figures)
    assert lag_max < rr_max, figures
    assert lag_mean < rr_mean, figures
    # and the lag picker keeps up (round-robin lets the hot shard fall ever further behind)
    assert lag_max <= 30, figures
    assert rr_backlog[0] > 10 * sum(lag_backlog), figures
