"""Queue statistics per worker and per shard, in the shape of Lowkiq's stats API.

* ``length``: jobs waiting; ``in_flight``: jobs received and not yet done (running,
  held by a node, or waiting out a retry delay); ``morgue_length``: dead jobs.
* ``lag``: seconds since the oldest job still in the queue was published. The
  embedded broker knows it exactly; SQS exposes no message ages, so there it is
  ``None`` (a node's own lag estimates are in its Prometheus metrics).
* ``done``: jobs ever deleted from the shard queues (succeeded or moved to the
  morgue), where the broker counts them (embedded); ``None`` on SQS.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from shardq.broker.base import QueueCounts
from shardq.errors import QueueNotFoundError

if TYPE_CHECKING:
    from shardq.app import App


@dataclass(frozen=True)
class ShardStats:
    shard: int
    queue: str
    length: int
    in_flight: int
    lag: float | None
    done: int | None


@dataclass(frozen=True)
class WorkerStats:
    name: str
    priority: int
    length: int
    in_flight: int
    morgue_length: int
    lag: float | None
    done: int | None
    shards: list[ShardStats]


@dataclass(frozen=True)
class Stats:
    time: float
    broker: str
    workers: list[WorkerStats]

    def to_dict(self) -> dict[str, Any]:
        """``{"time", "broker", "total": {...}, "by_worker": {name: {..., "shards": [...]}}}``."""
        by_worker = {
            w.name: {k: v for k, v in asdict(w).items() if k != "name"} for w in self.workers
        }
        return {
            "time": self.time,
            "broker": self.broker,
            "total": {
                "length": sum(w.length for w in self.workers),
                "in_flight": sum(w.in_flight for w in self.workers),
                "morgue_length": sum(w.morgue_length for w in self.workers),
                "lag": _max(w.lag for w in self.workers),
                "done": _sum(w.done for w in self.workers),
            },
            "by_worker": by_worker,
        }


def collect(app: App) -> Stats:
    """Read the counts of every shard and morgue queue of the app's workers."""
    now = time.time()
    workers = []
    for name in app.workers:
        settings = app.settings(name)
        shards = []
        for shard in range(settings.shards):
            queue = app.shard_queue(name, shard)
            counts = _counts(app, queue)
            lag = None if counts.oldest_sent_at is None else max(0.0, now - counts.oldest_sent_at)
            shards.append(
                ShardStats(
                    shard, queue, counts.waiting, counts.in_flight, lag, counts.deleted_total
                )
            )
        morgue = _counts(app, app.morgue_queue(name))
        workers.append(
            WorkerStats(
                name=name,
                priority=settings.priority,
                length=sum(s.length for s in shards),
                in_flight=sum(s.in_flight for s in shards),
                morgue_length=morgue.waiting + morgue.in_flight,
                lag=_max(s.lag for s in shards),
                done=_sum(s.done for s in shards),
                shards=shards,
            )
        )
    return Stats(now, app.broker.kind, workers)


def _counts(app: App, queue: str) -> QueueCounts:
    try:
        return app.broker.counts(queue)
    except QueueNotFoundError:  # not created yet: nothing was ever published to it
        return QueueCounts(0, 0)


def _max(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _sum(values: Any) -> int | None:
    items = list(values)
    return None if any(v is None for v in items) else sum(items)
