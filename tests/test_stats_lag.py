"""A lag that leaves out shards whose age nobody knows is shown as a lower bound (on
SQS, shards no live node serves): never as the whole, never as 0."""

from __future__ import annotations

from shardq.ops.admin import lag_cell
from shardq.ops.stats import ShardStats, WorkerStats


def worker(*shards: tuple[int, float | None]) -> WorkerStats:
    """A worker whose shard n has ``(jobs waiting, lag)``."""
    rows = [ShardStats(n, f"q{n}", length, 0, lag, None) for n, (length, lag) in enumerate(shards)]
    known = [lag for _, lag in shards if lag is not None]
    return WorkerStats(
        "W", 1, sum(n for n, _ in shards), 0, 0, max(known, default=None), None, rows
    )


def test_every_shard_with_jobs_has_a_known_lag_then_the_lag_is_the_whole() -> None:
    w = worker((3, 42.0), (0, None))  # an empty shard nobody serves: nothing left out
    assert w.unknown_lags == 0
    assert lag_cell(w.lag, w.unknown_lags) == "42.0 s"


def test_a_shard_with_jobs_and_no_known_lag_makes_the_lag_a_lower_bound() -> None:
    w = worker((3, 42.0), (5, None))
    assert w.unknown_lags == 1
    assert lag_cell(w.lag, w.unknown_lags) == ">=42.0 s"
    # and its own row says unknown rather than a blank
    assert lag_cell(w.shards[1].lag, 1) == "unknown"


def test_no_known_lag_at_all_is_unknown_not_zero() -> None:
    w = worker((3, None), (5, None))
    assert (w.lag, w.unknown_lags) == (None, 2)
    assert lag_cell(w.lag, w.unknown_lags) == "unknown"
    assert lag_cell(None, 0) == "-"  # nothing waiting and nothing known
