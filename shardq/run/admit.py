"""What a lane may start (:mod:`shardq.run.slots`): another batch, and an entity's jobs
in its own thread (inline) instead of a slot.

Back-pressure: a lane starts another batch only while fewer jobs than slots wait for
one. A hand-over to a slot thread costs more than a blank job, so a worker known to be
quick (by the mean time its jobs took) runs in the lane that received it while a slot
is free, counted as one slot.
"""

from __future__ import annotations

#: A worker whose mean ``perform`` takes less than this runs in its lane, not a slot.
INLINE_BELOW_SECONDS = 0.0005
#: Weight of the newest duration in a worker's mean.
ALPHA = 0.1


def may_take(waiting_jobs: int, concurrency: int) -> bool:
    """May a lane start another batch? While fewer jobs than slots wait for one."""
    return waiting_jobs < concurrency


def run_inline(mean_seconds: float | None, busy: int, concurrency: int) -> bool:
    """Run an entity in its lane instead of a slot? For a worker known to be quick (a
    hand-over costs more than its jobs), while a slot is free. A worker not measured
    yet runs in slots: its first jobs may wait long, or on each other."""
    quick = mean_seconds is not None and mean_seconds < INLINE_BELOW_SECONDS
    return quick and busy < concurrency


def mean_after(mean: float | None, each: float) -> float:
    """A worker's mean time per job after a run whose jobs took ``each`` on average."""
    return each if mean is None else mean + ALPHA * (each - mean)
