"""Which entities a lane runs itself rather than in a slot: a worker's mean time per
job (:func:`run_inline`), and when a lane may start another batch (:func:`may_take`)."""

from __future__ import annotations

from typing import NamedTuple

#: A worker whose mean ``perform`` takes less than this runs in its lane, not a slot.
INLINE_BELOW_SECONDS = 0.0005
#: Weight of the newest duration in a worker's mean.
ALPHA = 0.1
#: A worker's mean counts once this many of its jobs were measured.
KNOWN_AFTER_JOBS = 100


class Timing(NamedTuple):
    """A worker's mean time per job, and how many of its jobs were measured."""

    mean: float
    jobs: int


def may_take(waiting_jobs: int, concurrency: int) -> bool:
    """May a lane start another batch? While fewer jobs than slots wait for one."""
    return waiting_jobs < concurrency


def run_inline(timing: Timing | None, busy: int, concurrency: int) -> bool:
    """Run an entity in its lane instead of a slot? For a worker known to be quick (a
    hand-over costs more than its jobs), while a slot is free. A worker not measured
    enough yet runs in slots: its first jobs may wait long, or on each other."""
    if timing is None or timing.jobs < KNOWN_AFTER_JOBS:
        return False
    return timing.mean < INLINE_BELOW_SECONDS and busy < concurrency


def timing_after(timing: Timing | None, each: float, jobs: int) -> Timing:
    """A worker's timing after a run of ``jobs`` jobs that took ``each`` on average."""
    if timing is None:
        return Timing(each, jobs)
    return Timing(timing.mean + ALPHA * (each - timing.mean), timing.jobs + jobs)
