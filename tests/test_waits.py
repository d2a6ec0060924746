"""Waits with a timeout on an injected clock end on it or in real time, whichever first."""

from __future__ import annotations

import threading

import pytest

from shardq.core.clock import ManualClock, monotonic
from shardq.run.waits import STEP, Deadline, until_next_look, wait_until
from tests.clocks import ends_within


def test_a_deadline_passes_when_the_injected_clock_reaches_it() -> None:
    # given a 10 s deadline on an injected clock, real time standing still
    clock, real = ManualClock(), ManualClock(50.0)
    deadline = Deadline(clock, 10, real)
    # when the injected clock moves 4 s, then 6 s are left; when 6 more, none
    clock.advance(4)
    assert deadline.left() == 6.0
    clock.advance(6)
    assert deadline.left() == 0.0


def test_a_deadline_passes_in_real_time_when_nobody_moves_the_injected_clock() -> None:
    # given a 10 s deadline on an injected clock nobody moves
    clock, real = ManualClock(), ManualClock(50.0)
    deadline = Deadline(clock, 10, real)
    # when 7 real seconds pass, then 3 are left; when 3 more, none
    real.advance(7)
    assert deadline.left() == 3.0
    real.advance(3)
    assert deadline.left() == 0.0


def test_a_waiter_looks_at_its_clock_again_within_a_step() -> None:
    clock, real = ManualClock(), ManualClock()
    assert Deadline(clock, 10, real).step() == STEP
    assert Deadline(clock, STEP / 2, real).step() == pytest.approx(STEP / 2)


def test_a_wait_on_a_clock_nobody_moves_ends_after_its_timeout_in_real_time() -> None:
    # given a condition nobody notifies, and a clock nobody moves
    cond = threading.Condition()

    def wait() -> bool:
        with cond:
            return wait_until(cond, lambda: False, Deadline(ManualClock(), 0.2))

    # when a wait of 0.2 s begins, then it ends, not done
    assert ends_within(10, wait) is False


def test_a_wait_ends_soon_after_the_injected_clock_passes_its_deadline() -> None:
    # given a wait of an hour on a clock the test moves, on a condition nobody notifies
    cond, clock = threading.Condition(), ManualClock()
    deadline = Deadline(clock, 3600)

    def wait() -> bool:
        with cond:
            return wait_until(cond, lambda: False, deadline)

    # when the clock moves an hour on while it waits
    threading.Timer(0.05, clock.advance, [3600]).start()
    # then the wait ends, not done, long before an hour of real time
    assert ends_within(10, wait) is False


def test_a_sleeper_on_the_real_monotonic_clock_looks_again_only_when_due() -> None:
    # the real monotonic clock cannot jump; any other clock is read again within a step
    assert until_next_look(monotonic, 10.0) == 10.0
    assert until_next_look(ManualClock(), 10.0) == STEP
    assert until_next_look(ManualClock(), STEP / 2) == STEP / 2
