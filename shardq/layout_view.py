"""What operators see of the live layouts: each worker's generation and shards, a
reshard in progress, and where the code's ``shards`` no longer says what runs.

``shardq stats``, ``shardq nodes`` and the dashboard show this view. The pure part
(:func:`layout_view`) takes a layout and the job counts of its old generation; the
rest reads them (:func:`reshards`: one request per old queue of a worker resharding).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardq.errors import BrokerError, QueueNotFoundError
from shardq.layout import WorkerLayout
from shardq.terminal import plural

if TYPE_CHECKING:
    from shardq.app import App


@dataclass(frozen=True)
class ReshardView:
    """A reshard in progress: ``old_open`` of ``from_shards`` old shards still open and
    ``old_jobs`` jobs (waiting or in flight) still in them (None: not known)."""

    worker: str
    from_shards: int
    to_shards: int
    from_gen: int
    to_gen: int
    started: float
    seconds: float
    trust: float
    old_open: int
    old_jobs: int | None
    by: str = ""
    #: Old shards narrowed to the entities still stuck in them: shard -> entities.
    pending: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def phase(self) -> str:
        """``switching`` (publishers may still send to the old layout) or ``closing``."""
        return "switching" if self.seconds < self.trust else "closing"

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "from": self.from_shards,
            "to": self.to_shards,
            "from_gen": self.from_gen,
            "to_gen": self.to_gen,
            "started": self.started,
            "seconds": round(self.seconds, 1),
            "trust": self.trust,
            "phase": self.phase,
            "old_shards_open": self.old_open,
            "old_shards": self.from_shards,
            "old_jobs": self.old_jobs,
            "by": self.by,
            "narrowed": {str(k): list(v) for k, v in sorted(self.pending.items())},
        }

    def text(self) -> str:
        """One line: ``SyncOrder: resharding 8 -> 16 shards ...``."""
        jobs = "? jobs" if self.old_jobs is None else plural(self.old_jobs, "job")
        switching = (
            f"; publishers switch for {self.trust - self.seconds:.0f} s more"
            if self.phase == "switching"
            else ""
        )
        return (
            f"{self.worker}: resharding {self.from_shards} -> {self.to_shards} shards "
            f"(generation {self.from_gen} -> {self.to_gen}), {self.seconds:.0f} s in"
            f"{switching}; {self.old_open} of {self.from_shards} old shards still open; "
            f"{jobs} still in the old layout{self._narrowed()}"
        )

    def _narrowed(self) -> str:
        if not self.pending:
            return ""
        stuck = sorted({e for v in self.pending.values() for e in v})
        shown = ", ".join(stuck[:5]) + (f" and {len(stuck) - 5} more" if len(stuck) > 5 else "")
        return (
            f"; {plural(len(self.pending), 'old shard')} open only to the entities stuck "
            f"in {'them' if len(self.pending) > 1 else 'it'} ({shown})"
        )


@dataclass(frozen=True)
class LayoutView:
    """One worker's live layout next to its code's ``shards``."""

    worker: str
    gen: int
    shards: int
    code_shards: int
    since: float
    reshard: ReshardView | None = None
    #: Retired generations whose queues are not all deleted: (gen, shards, left, ended).
    retired: tuple[tuple[int, int, int, float], ...] = ()

    @property
    def note(self) -> str | None:
        """What to know when the code's ``shards`` is not the live layout's."""
        if self.code_shards == self.shards:
            return None
        return (
            f"{self.worker}: code says {plural(self.code_shards, 'shard')}, live layout has "
            f"{self.shards} (resharded); the live layout is used"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gen": self.gen,
            "shards": self.shards,
            "code_shards": self.code_shards,
            "since": self.since,
            "note": self.note,
            "reshard": None if self.reshard is None else self.reshard.to_json(),
            "retired": [
                {"gen": g, "shards": n, "queues_left": left, "ended": ended}
                for g, n, left, ended in self.retired
            ],
        }


def layout_view(
    worker: str, layout: WorkerLayout, code_shards: int, now: float, old_jobs: int | None
) -> LayoutView:
    """The view of ``worker``'s ``layout`` at ``now``; ``old_jobs`` counts the jobs in
    the old generation's queues during a move (ignored otherwise)."""
    move = layout.moving
    reshard = None
    if move is not None:
        reshard = ReshardView(
            worker=worker,
            from_shards=move.shards,
            to_shards=layout.shards,
            from_gen=move.gen,
            to_gen=layout.gen,
            started=move.started,
            seconds=max(0.0, now - move.started),
            trust=move.trust,
            old_open=len(move.left),
            old_jobs=old_jobs,
            by=move.by,
            pending=dict(move.pending),
        )
    retired = tuple((r.gen, r.shards, len(r.left), r.ended) for r in layout.retired if r.left)
    return LayoutView(
        worker, layout.gen, layout.shards, code_shards, layout.since, reshard, retired
    )


def old_jobs(app: App, worker: str, layout: WorkerLayout) -> int:
    """Jobs waiting or in flight in the old generation's queues of ``worker``'s move
    (0 when none); a broker error is raised."""
    move = layout.moving
    if move is None:
        return 0
    total = 0
    for shard in range(move.shards):
        try:
            counts = app.broker.counts(app.shard_queue(worker, shard, move.gen))
        except QueueNotFoundError:
            continue
        total += counts.waiting + counts.in_flight
    return total


def reshards(app: App, now: float | None = None) -> list[ReshardView]:
    """Every reshard in progress among the app's workers, from a fresh read of the
    layout document (a worker's old-layout jobs are None if they cannot be counted)."""
    now = time.time() if now is None else now
    app.layouts.refresh()
    found = []
    for name in app.workers:
        layout = app.layouts.cached(name)
        if layout.moving is None:
            continue
        try:
            jobs: int | None = old_jobs(app, name, layout)
        except BrokerError:
            jobs = None
        view = layout_view(name, layout, app.settings(name).shards, now, jobs)
        if view.reshard is not None:
            found.append(view.reshard)
    return found
