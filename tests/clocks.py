"""A clock for tests that run parts in threads: real time, moved forward by the test."""

from __future__ import annotations

import time


class Skipping:
    """Monotonic seconds plus ``offset``, which the test raises to skip time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset
