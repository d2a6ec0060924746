"""What ``shardq stats``, ``shardq nodes`` and the dashboard show of the live layouts:
each worker's generation and shards, a reshard in progress, the code's ``shards``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.layout import Move, WorkerLayout
from shardq.core.terminal import plural
from shardq.core.topology import shard_key

if TYPE_CHECKING:
    from shardq.api.app import App
    from shardq.ops.fleet_view import FleetView


@dataclass(frozen=True)
class ReshardView:
    """A reshard in progress: its ``open`` old shards, the jobs still in them and the
    ones no node holds (None: not known)."""

    worker: str
    from_shards: int
    to_shards: int
    from_gen: int
    to_gen: int
    phase: str  # announced or switched
    trust: float
    open: tuple[int, ...]
    old_jobs: int | None
    by: str = ""
    unserved: tuple[int, ...] | None = None
    #: Old shard -> the node, not live now, that held it last (of the unserved ones).
    last_held: Mapping[int, str] = field(default_factory=dict)

    @property
    def stuck(self) -> str | None:
        """Why the reshard cannot end now (and who held the old shards nobody serves)."""
        key = {s: shard_key(self.worker, s, self.from_gen) for s in self.unserved or ()}
        if self.unserved and len(self.unserved) == len(self.open):
            why = (
                "no node serves the old shards (is any node running? shardq nodes): the "
                "reshard does not progress until one does"
            )
        elif self.phase == "switched" and self.unserved:
            shards = ", ".join(key[s] for s in self.unserved[:8])
            why = (
                f"{plural(len(self.unserved), 'old shard')} ({shards}) held by no node: "
                "the reshard cannot end until a node serves them (start one: shardq run)"
            )
        else:
            return None
        for node in sorted(set(self.last_held.values())):
            keys = [key[s] for s in self.unserved if self.last_held.get(s) == node]
            more = ", ..." if len(keys) > 8 else ""
            why += f"; last held by {node} ({', '.join(keys[:8])}{more})"
        return why

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "from": self.from_shards,
            "to": self.to_shards,
            "from_gen": self.from_gen,
            "to_gen": self.to_gen,
            "trust": self.trust,
            "phase": self.phase,
            "old_shards_open": len(self.open),
            "old_shards": self.from_shards,
            "open": list(self.open),
            "old_jobs": self.old_jobs,
            "by": self.by,
            "unserved": None if self.unserved is None else list(self.unserved),
            "last_held": {str(k): v for k, v in sorted(self.last_held.items())},
            "stuck": self.stuck,
        }

    def text(self) -> str:
        """``SyncOrder: resharding 8 -> 16 shards ...``."""
        jobs = "? jobs" if self.old_jobs is None else plural(self.old_jobs, "job")
        phase = (
            "announced (publishers switch once every copy of the old layout expired, "
            f"{self.trust:.0f} s after a node or the command saw it)"
            if self.phase == "announced"
            else "switched"
        )
        stuck = f"; STUCK: {self.stuck}" if self.stuck else ""
        return (
            f"{self.worker}: resharding {self.from_shards} -> {self.to_shards} shards "
            f"(generation {self.from_gen} -> {self.to_gen}), {phase}; {len(self.open)} of "
            f"{self.from_shards} old shards still open; {jobs} still in the old layout{stuck}"
        )


@dataclass(frozen=True)
class LayoutView:
    """One worker's live layout next to its code's ``shards``."""

    worker: str
    gen: int
    shards: int
    code_shards: int
    reshard: ReshardView | None = None
    #: Retired generations whose queues are not all deleted: (gen, shards, left).
    retired: tuple[tuple[int, int, int], ...] = ()

    @property
    def note(self) -> str | None:
        """What to know when the code's ``shards`` is not the live layout's."""
        if self.code_shards == self.shards:
            return None
        if self.gen == 0 and self.reshard is None:  # never resharded: this code is refused
            return (
                f"{self.worker}: code says {plural(self.code_shards, 'shard')}, its queues "
                f"were recorded with {self.shards}; publishers and nodes of this code refuse "
                f"it until `shardq reshard {self.worker} --shards {self.code_shards}`"
            )
        return (
            f"{self.worker}: code says {plural(self.code_shards, 'shard')}, live layout has "
            f"{self.shards} (resharded); the live layout is used"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gen": self.gen,
            "shards": self.shards,
            "code_shards": self.code_shards,
            "note": self.note,
            "reshard": None if self.reshard is None else self.reshard.to_json(),
            "retired": [
                {"gen": g, "shards": n, "queues_left": left} for g, n, left in self.retired
            ],
        }


def layout_view(
    worker: str,
    layout: WorkerLayout,
    code_shards: int,
    old_jobs: int | None,
    fleet: FleetView | None = None,
) -> LayoutView:
    """The view of ``worker``'s ``layout``, with the jobs in its old generation's queues
    and, given the ``fleet``, the old shards no live node holds and who held them last."""
    move = layout.moving
    reshard = None if move is None else _reshard_view(worker, layout, move, old_jobs, fleet)
    retired = tuple((r.gen, r.shards, len(r.left)) for r in layout.retired if r.left)
    return LayoutView(worker, layout.gen, layout.shards, code_shards, reshard, retired)


def _reshard_view(
    worker: str, layout: WorkerLayout, move: Move, old_jobs: int | None, fleet: FleetView | None
) -> ReshardView:
    unserved, last = None, {}
    if fleet is not None:
        unserved = tuple(s for s in move.left if fleet.owner(worker, s, move.gen) is None)
        last = {s: n for s in unserved if (n := fleet.last_holder(worker, s, move.gen))}
    return ReshardView(
        worker, move.shards, layout.shards, move.gen, layout.gen, layout.state,
        layout.trust, tuple(move.left), old_jobs, move.by, unserved, last,
    )  # fmt: skip


def reshards(app: App, fleet: FleetView | None = None) -> list[ReshardView]:
    """Every reshard in progress, from a fresh read of the layouts, with the jobs still in
    its old queues (None: the broker failed); with the ``fleet``, who holds (or last held)
    each old shard."""
    app.layouts.refresh()
    views = []
    for name in app.workers:
        layout = app.layouts.cached(name)
        if layout.moving is not None:
            jobs = _old_jobs(app, name, layout.moving)
            views.append(_reshard_view(name, layout, layout.moving, jobs, fleet))
    return views


def _old_jobs(app: App, worker: str, move: Move) -> int | None:
    total = 0
    for shard in range(move.shards):
        try:
            counts = app.broker.counts(app.shard_queue(worker, shard, move.gen))
        except QueueNotFoundError:
            continue
        except BrokerError:
            return None
        total += counts.waiting + counts.in_flight
    return total


def layout_lines(views: Sequence[LayoutView], error: str | None) -> list[str]:
    """What ``shardq stats`` prints under its table about the layouts (``error``: why
    they could not be read)."""
    lines = []
    if views:
        lines.append(
            "live layouts: "
            + "; ".join(f"{v.worker} {v.shards} shards (generation {v.gen})" for v in views)
        )
    for view in views:
        if view.note:
            lines.append(view.note)
        if view.reshard is not None:
            lines.append(view.reshard.text())
        for gen, shards, left in view.retired:
            lines.append(
                f"{view.worker}: generation {gen} retired ({shards} shards); {left} of its queues "
                "not deleted yet (they relay late jobs; nodes delete them once empty after "
                "twice the trust window, or `shardq queues ensure --prune`)"
            )
    if error:
        lines.append(f"layouts: {error}; shown as last read (else as the code says)")
    return lines
