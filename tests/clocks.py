"""Clocks for tests that run parts in threads: real time moved forward by the test, and
a bound on how long a wait may take."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Skipping:
    """Monotonic seconds plus ``offset``, which the test raises to skip time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def ends_within(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` in a thread, which must end within ``seconds`` real seconds (a wait that
    never ends fails the test instead of hanging it); its result."""
    results: list[T] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    assert results, "it raised (see the thread's exception above)"
    return results[0]
