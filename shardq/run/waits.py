"""Waits whose timeout is measured on an injected clock: they end once it passed on that
clock or in real time, whichever comes first (docs/design/run.md, "Clocks").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shardq.core.clock import Clock, monotonic

#: Longest real wait before a waiter reads its injected clock again.
STEP = 0.05


class Deadline:
    """``timeout`` seconds from now on ``clock`` and on ``real`` (real time)."""

    def __init__(self, clock: Clock, timeout: float, real: Clock = time.monotonic) -> None:
        self._clock, self._real = clock, real
        self._at, self._real_at = clock() + timeout, real() + timeout

    def left(self) -> float:
        """Seconds left (0: passed), the lesser of both clocks'."""
        return max(0.0, min(self._at - self._clock(), self._real_at - self._real()))

    def step(self) -> float:
        """How long to wait before looking again: what is left, at most :data:`STEP`."""
        return min(self.left(), STEP)


def until_next_look(clock: Clock, left: float) -> float:
    """How long a thread that sleeps ``left`` seconds of ``clock`` waits before reading
    it again: all of it on the real monotonic clock (which cannot jump), at most
    :data:`STEP` on any other."""
    return left if clock is monotonic else min(left, STEP)


def wait_until(cond: threading.Condition, done: Callable[[], bool], deadline: Deadline) -> bool:
    """With ``cond`` held, wait on it until ``done()`` or the deadline; returns ``done()``."""
    while not done():
        step = deadline.step()
        if step <= 0:
            return False
        cond.wait(step)
    return True
