"""``node.progress``: a node's throughput and lag, logged now and then."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from shardq.core.clock import Clock, monotonic

if TYPE_CHECKING:
    from shardq.core.outcome import Tally

log = structlog.get_logger("shardq.node")


class Progress:
    """``node.progress`` every ``progress_seconds``: jobs/s per worker and the max lag."""

    def __init__(
        self,
        every: float,
        tally: Callable[[], Tally],
        lags: Callable[[], list[tuple[str, int, float]]],
        held: Callable[[], int],
        slots: Callable[[], tuple[int, int]],
        clock: Clock = monotonic,
    ) -> None:
        """``slots``: (in use, concurrency)."""
        self._tally, self._lags, self._held, self._slots = tally, lags, held, slots
        self._every, self._clock = every, clock
        self._last = self._clock()
        self._done: dict[str, int] = {}

    def maybe_log(self) -> None:
        now = self._clock()
        if not self._every or now - self._last < self._every:
            return
        tally = self._tally()
        done: dict[str, int] = {}
        for kind in (tally.succeeded, tally.morgued):
            for worker, n in kind.items():
                done[worker] = done.get(worker, 0) + n
        rates = {
            w: round((n - self._done.get(w, 0)) / (now - self._last), 1) for w, n in done.items()
        }
        lags = [lag for _, _, lag in self._lags()]
        in_use, concurrency = self._slots()
        log.info(
            "node.progress",
            jobs_per_second=rates,
            done=sum(done.values()),
            max_lag=round(max(lags, default=0.0), 3),
            held=self._held(),
            slots_in_use=in_use,
            concurrency=concurrency,
        )
        self._last, self._done = now, done
