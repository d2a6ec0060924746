"""The clock: time-dependent parts take a :data:`Clock`, so tests set the time instead of
sleeping. :data:`monotonic` for expiry and durations; :data:`wall` for what people read
and broker timestamps."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds, from some fixed point: ``clock()`` is now.
Clock = Callable[[], float]

monotonic: Clock = time.monotonic
wall: Clock = time.time


class ManualClock:
    """A clock that moves only when told (tests): ``clock()`` is now."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
