"""Time limits: when a running ``perform`` is overdue is decided on the node's clock."""

from __future__ import annotations

import time

import pytest

from shardq.core.clock import ManualClock
from shardq.run.timelimit import Running, TimeLimitExceeded, TimeLimits, overdue


# -- the decision, on plain data ----------------------------------------------------------
def test_only_calls_past_their_deadline_are_overdue_and_the_watch_waits_for_the_next() -> None:
    # given calls due at 10 and 20, one due at 5 already interrupted, one at 6 done
    early, late = Running(1, 10.0), Running(2, 20.0)
    fired, done = Running(3, 5.0, fired=True), Running(4, 6.0, done=True)
    # when the watch looks at 15
    due, wait = overdue([early, late, fired, done], 15.0)
    # then only the call due at 10 is to be interrupted, and the next look is in 5 s
    assert due == [early]
    assert wait == 5.0


@pytest.mark.parametrize(
    ("running", "expected"),
    [([], 1.0), ([Running(1, 100.001)], 0.005), ([Running(1, 10.0, done=True)], 1.0)],
)
def test_the_watch_looks_again_in_a_second_when_nothing_is_due_and_never_sooner_than_5_ms(
    running: list[Running], expected: float
) -> None:
    assert overdue(running, 100.0) == ([], expected)


def test_a_call_is_due_at_its_limit_exactly() -> None:
    call = Running(1, 10.0)
    assert overdue([call], 10.0)[0] == [call]
    assert overdue([call], 9.999)[0] == []


# -- the watch, on a clock the test moves ----------------------------------------------------
def test_a_call_is_interrupted_once_the_clock_passes_its_limit_not_before() -> None:
    # given time limits on a clock the test moves, and a 0.05 s limit
    clock = ManualClock()
    limits = TimeLimits(clock)
    phases: list[str] = []

    def compute() -> None:
        # a tenth of a second of real time passes, but not on the clock
        until = time.monotonic() + 0.1
        while time.monotonic() < until:
            pass
        phases.append("not interrupted while the clock stood still")
        clock.advance(1.0)
        until = time.monotonic() + 30
        while time.monotonic() < until:  # pure Python: interruptible
            pass
        phases.append("ran on past the limit")

    # when a call computes, and the clock passes its limit
    with pytest.raises(TimeLimitExceeded):
        limits.run(compute, 0.05)
    limits.close()
    # then it is interrupted only after the clock moved
    assert phases == ["not interrupted while the clock stood still"]


def test_an_interrupted_call_that_swallowed_the_interruption_still_overran() -> None:
    # given time limits on a clock the test moves, and a call that catches everything
    clock = ManualClock()
    limits = TimeLimits(clock)

    def swallow() -> str:
        clock.advance(1.0)
        try:
            until = time.monotonic() + 30
            while time.monotonic() < until:
                pass
        except TimeLimitExceeded:
            return "swallowed"
        return "ran on"

    # when it runs past its limit
    result, overran = limits.run(swallow, 0.05)
    limits.close()
    # then it returned, and the overrun is still known
    assert (result, overran) == ("swallowed", True)


def test_a_long_limit_is_enforced_soon_after_the_clock_jumps_past_it() -> None:
    # given time limits on a clock the test moves, and a call with a 60 s limit
    clock = ManualClock()
    limits = TimeLimits(clock)

    def compute() -> str:
        clock.advance(61)  # when the clock jumps past the limit while it computes
        until = time.monotonic() + 30
        while time.monotonic() < until:  # pure Python: interruptible
            pass
        return "ran on"

    # then it is interrupted within a fraction of a second, not 60 s of real time later
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        limits.run(compute, 60)
    limits.close()
    assert time.monotonic() - started < 5


def test_a_call_without_a_limit_runs_unwatched() -> None:
    limits = TimeLimits(ManualClock())
    assert limits.run(lambda: 7, None) == (7, False)
