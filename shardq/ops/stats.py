"""Queue statistics per worker and per shard (lengths, in flight, morgue sizes, lag,
owners, live layouts and the fleet), as ``shardq stats`` and ``/api/v1/stats`` show them.
The fields are described in docs/operations.md (``shardq stats``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from shardq.broker.base import QueueCounts
from shardq.core.errors import LayoutError, QueueNotFoundError
from shardq.core.topology import parse_key, parse_name, shard_key
from shardq.morgue import COUNTED, Morgue
from shardq.ops.fleet_view import FleetItems, FleetView, fleet_view, read_fleet
from shardq.ops.layout_view import LayoutView, ReshardView, layout_view
from shardq.store import DamagedItem, StoreError
from shardq.store.deployment import live_shards

#: Brokers that know each queue's oldest message, hence the exact lag.
KNOWS_AGES = frozenset({"sqlite", "memory"})

if TYPE_CHECKING:
    from shardq.api.app import App


@dataclass(frozen=True)
class ShardStats:
    shard: int
    queue: str
    length: int
    in_flight: int
    lag: float | None
    done: int | None
    owner: str | None = None
    gen: int = 0  # the layout generation of this shard's queue

    @property
    def lag_unknown(self) -> bool:
        """Jobs wait here and nobody knows their lag (on SQS: no live node serves it)."""
        return self.lag is None and self.length > 0


@dataclass(frozen=True)
class WorkerStats:
    name: str
    priority: int
    length: int
    in_flight: int
    morgue_length: int | None  # None: the state store could not be read
    lag: float | None
    done: int | None
    shards: list[ShardStats]
    layout: LayoutView | None = None
    #: Done/retried/failed since each live node started, from their reports.
    reported: dict[str, int] | None = None
    #: The morgue holds :data:`~shardq.morgue.COUNTED` or more: only so many are counted.
    morgue_more: bool = False

    @property
    def unknown_lags(self) -> int:
        """Shards whose lag is unknown: ``lag`` leaves them out, so it is a lower bound."""
        return sum(s.lag_unknown for s in self.shards)


@dataclass(frozen=True)
class Stats:
    time: float
    broker: str
    workers: list[WorkerStats]
    fleet: FleetView = field(default_factory=lambda: FleetView(0.0))
    #: Why the fleet items could not be read (the counts are still right).
    fleet_error: str | None = None
    #: Why the layouts could not be read (the code's layouts are shown).
    layout_error: str | None = None
    #: Set when none of the workers' queues exists: says so and what to check.
    no_queues: str | None = None
    #: Why the morgues' sizes could not be read (``morgue_length`` is None).
    morgue_error: str | None = None

    @property
    def reshards(self) -> list[ReshardView]:
        """The reshards in progress in this sample."""
        return [w.layout.reshard for w in self.workers if w.layout and w.layout.reshard]

    @property
    def lag_source(self) -> str | None:
        """Where the lags come from: ``broker``, ``reports`` or None (unknown)."""
        if self.broker in KNOWS_AGES:
            return "broker"
        return "reports" if self.fleet.reported else None

    def to_dict(self) -> dict[str, Any]:
        """``{"time", "broker", "lag_source", "total": {...}, "by_worker": {name: {...,
        "shards": [...]}}, "fleet"}``."""
        by_worker = {
            w.name: {
                **{k: v for k, v in asdict(w).items() if k not in ("name", "layout")},
                "layout": None if w.layout is None else w.layout.to_json(),
            }
            for w in self.workers
        }
        dead = [w.morgue_length for w in self.workers]
        morgue_length = None if None in dead else sum(d or 0 for d in dead)
        return {
            "time": self.time,
            "broker": self.broker,
            "lag_source": self.lag_source,
            "total": {
                **_totals(self.workers),
                "morgue_length": morgue_length,
                "morgue_more": any(w.morgue_more for w in self.workers),
            },
            "by_worker": by_worker,
            "fleet": _fleet_dict(self.fleet),
            "fleet_error": self.fleet_error,
            "fleet_damaged": list(self.fleet.damaged),
            "layout_error": self.layout_error,
            "no_queues": self.no_queues,
            "morgue_error": self.morgue_error,
        }


def collect(app: App) -> Stats:
    """Read the layouts, every live shard queue's counts, the morgues' sizes and the fleet
    items (each shard's owner, and its lag where the broker cannot tell it)."""
    now = time.time()
    try:
        app.layouts.refresh()
        layout_error = None
    except (LayoutError, StoreError, DamagedItem) as exc:  # shown as last read, else as code says
        layout_error = str(exc)
    try:
        fleet, fleet_error = current_fleet(app, now), None
    except (StoreError, DamagedItem) as exc:  # the store cannot be read: counts still help
        fleet, fleet_error = fleet_view(FleetItems(), now, live_shards(app)), str(exc)
    try:
        dead, morgue_error = {name: Morgue(app, name).size() for name in app.workers}, None
    except (StoreError, DamagedItem) as exc:  # the queues' counts still help
        dead, morgue_error = {}, str(exc)
    workers = [_worker_stats(app, name, fleet, now, dead.get(name)) for name in app.workers]
    idle = bool(workers) and not any(w.length or w.in_flight or w.morgue_length for w in workers)
    none = no_queues_text(app) if idle and not queues_exist(app) else None
    errors = fleet_error, layout_error, none, morgue_error
    return Stats(now, app.broker.kind, workers, fleet, *errors)


def no_queues_text(app: App) -> str:
    """What ``stats``, ``nodes`` and the dashboard say when the app has no queues."""
    prefix = app.config.queue_prefix
    return (
        f"no queues of this app exist with queue_prefix {prefix!r} on the {app.broker.kind} "
        "broker: check queue_prefix (SHARDQ_QUEUE_PREFIX, --queue-prefix) and the broker, "
        "or create them with `shardq queues ensure`"
    )


def queues_exist(app: App) -> bool:
    """Whether any shard queue (of the code's layout and of the live one as last read)
    or morgue queue of the workers exists; stops at the first found."""
    for name in app.workers:
        layout = app.layouts.cached(name)
        queues = [app.morgue_queue(name)]
        queues += [app.shard_queue(name, n) for n in range(app.settings(name).shards)]
        queues += [app.shard_queue(name, n, layout.gen) for n in range(layout.shards)]
        for queue in dict.fromkeys(queues):
            try:
                app.broker.counts(queue)
            except QueueNotFoundError:
                continue
            return True
    return False


def _worker_stats(
    app: App, name: str, fleet: FleetView, now: float, dead: int | None
) -> WorkerStats:
    settings = app.settings(name)
    layout = app.layouts.cached(name)
    shards = [
        _shard_stats(app, name, parse_name(gen_name)[1], shard, fleet, now)
        for gen_name, count in reversed(app.live_shards(name).items())  # the current first
        for shard in range(count)
    ]
    old_jobs = None
    if layout.moving is not None:
        old_jobs = sum(s.length + s.in_flight for s in shards if s.gen == layout.moving.gen)
    old_morgue = _counts(app, app.morgue_queue(name))  # until `queues ensure` moves it
    return WorkerStats(
        name=name,
        priority=settings.priority,
        morgue_length=None if dead is None else dead + old_morgue.waiting + old_morgue.in_flight,
        shards=shards,
        layout=layout_view(name, layout, settings.shards, old_jobs, fleet),
        reported=fleet.counts(name) if fleet.reported else None,
        morgue_more=dead is not None and dead >= COUNTED,
        **_totals(shards),
    )


def _totals(rows: Sequence[ShardStats | WorkerStats]) -> dict[str, Any]:
    """The rows' jobs waiting and in flight, their longest known lag, and their jobs done
    (None when a row's is unknown)."""
    done = [r.done for r in rows]
    return {
        "length": sum(r.length for r in rows),
        "in_flight": sum(r.in_flight for r in rows),
        "lag": max((r.lag for r in rows if r.lag is not None), default=None),
        "done": None if None in done else sum(d or 0 for d in done),
    }


def _shard_stats(
    app: App, name: str, gen: int, shard: int, fleet: FleetView, now: float
) -> ShardStats:
    queue = app.shard_queue(name, shard, gen)
    c = _counts(app, queue)
    lag = fleet.lag(name, shard, gen)
    if app.broker.kind in KNOWS_AGES:
        lag = None if c.oldest_sent_at is None else max(0.0, now - c.oldest_sent_at)
    owner = fleet.owner(name, shard, gen)
    return ShardStats(shard, queue, c.waiting, c.in_flight, lag, c.deleted_total, owner, gen)


def current_fleet(app: App, now: float) -> FleetView:
    """The fleet at ``now`` from a fresh read of the store, with the live layouts' shards
    no live node serves."""
    prefix = app.config.queue_prefix
    return fleet_view(read_fleet(app.store), now, live_shards(app), prefix)


def backlog(app: App, keys: Iterable[str]) -> dict[str, int]:
    """Shard key of the live layout -> jobs waiting in its queue (a queue never created: 0)."""
    result = {}
    for key in keys:
        name, shard = parse_key(key)
        worker, gen = parse_name(name)
        result[key] = _counts(app, app.shard_queue(worker, shard, gen)).waiting
    return result


def stats_backlog(stats: Stats) -> dict[str, int]:
    """Shard key -> jobs waiting, from the counts already collected."""
    return {shard_key(w.name, s.shard, s.gen): s.length for w in stats.workers for s in w.shards}


def _fleet_dict(fleet: FleetView) -> dict[str, Any] | None:
    if not fleet.reported:
        return None
    return {
        "nodes": len(fleet.nodes),
        "jobs_per_second": round(fleet.jobs_per_second, 3),
        **fleet.counts(),
        "excludes": fleet.excludes(),
        "unserved": list(fleet.unserved),
    }


def _counts(app: App, queue: str) -> QueueCounts:
    try:
        return app.broker.counts(queue)
    except QueueNotFoundError:  # not created yet: nothing was ever published to it
        return QueueCounts(0, 0)
