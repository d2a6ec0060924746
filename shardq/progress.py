"""``node.progress``: a node's throughput and lag, logged now and then."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from shardq.node import Node

log = structlog.get_logger("shardq.node")


class Progress:
    """``node.progress`` every ``progress_seconds``: jobs/s per worker and the max lag."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._every = node.config.progress_seconds
        self._last = time.monotonic()
        self._done: dict[str, int] = {}

    def maybe_log(self) -> None:
        now = time.monotonic()
        if not self._every or now - self._last < self._every:
            return
        tally = self._node.tally()
        done: dict[str, int] = {}
        for kind in (tally.succeeded, tally.morgued):
            for worker, n in kind.items():
                done[worker] = done.get(worker, 0) + n
        rates = {
            w: round((n - self._done.get(w, 0)) / (now - self._last), 1) for w, n in done.items()
        }
        lags = [lag for _, _, lag in self._node.lags()]
        log.info(
            "node.progress",
            jobs_per_second=rates,
            done=sum(done.values()),
            max_lag=round(max(lags, default=0.0), 3),
            held=self._node.leases.count(),
            slots_in_use=self._node.slots.in_use(),
            concurrency=self._node.slots.concurrency,
        )
        self._last, self._done = now, done
