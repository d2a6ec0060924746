"""The clock. Time-dependent parts take a :data:`Clock` (default: the system's), so their
tests set the time instead of sleeping. Expiry and durations use :data:`monotonic`;
:data:`wall` only stamps what people read or what is compared with a broker's timestamps.
"""

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
