"""What a node's heartbeat says of it: the shards it holds with their lags, its job
counts and rate, its slots."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardq.core.heartbeat import COUNTS, Heartbeat
from shardq.core.outcome import Tally
from shardq.core.topology import shard_key
from shardq.core.version import VERSION

if TYPE_CHECKING:
    from shardq.run.node import Node


class Rate:
    """A node's jobs per second, over a second or more."""

    def __init__(self, now: float) -> None:
        self._before: dict[str, int] = {}  # Tally.done() at ``_at``
        self._at, self.value = now, 0.0

    def update(self, tally: Tally, now: float) -> float:
        if now - self._at >= 1.0:
            self.value = sum(tally.rates(self._before, now - self._at).values())
            self._before, self._at = tally.done(), now
        return self.value


def heartbeat(
    of: Node, rate: Rate, now: float, held: Sequence[str] | None, **fields: Any
) -> Heartbeat:
    """The heartbeat of node ``of`` holding ``held`` (None: the shards it serves, a static
    node's); ``fields``: its id (``node``), ``started``, ``at``, ``mode``, ``expire``,
    ``prefix``."""
    tally = of.tally()
    done = tally.done()
    lags = {shard_key(w, s): round(lag, 3) for w, s, lag in of.lags()}
    held = sorted(lags) if held is None else held
    holds = set(held)
    counts = dict(zip(COUNTS, (done, tally.retried, tally.morgued), strict=True))
    return Heartbeat(
        host=socket.gethostname(),
        pid=os.getpid(),
        threads=len(of.lanes),
        held=tuple(held),
        lags={k: v for k, v in lags.items() if k in holds},
        jobs_per_second=round(rate.update(tally, now), 2),
        done=sum(done.values()),
        retried=sum(tally.retried.values()),
        failed=sum(tally.morgued.values()),
        by_worker={w: {k: c.get(w, 0) for k, c in counts.items()} for w in {*done, *tally.retried}},
        version=VERSION,
        concurrency=of.slots.concurrency,
        slots_in_use=of.slots.in_use(),
        **fields,
    )
