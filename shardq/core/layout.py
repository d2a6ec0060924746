"""A worker's live layout (item ``layout/<Worker>``) and its reshard transitions, pure
(docs/operations.md, "Resharding a live worker")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from shardq.core.errors import LayoutError
from shardq.core.jobs import MAX_SHARDS, SETTING_CHECKS, int_in
from shardq.core.topology import shard_for

#: Default of the config's ``reshard_trust_seconds``: how long a copy is trusted.
TRUST_SECONDS = 60.0
#: Added to ``trust`` before a node may close an old shard (sends in progress).
SWITCH_MARGIN_SECONDS = 5.0
#: Nodes read the layouts this often while a reshard is in progress.
NODE_REFRESH_SECONDS = 2.0

RUN, WAIT, RELAY = "run", "wait", "relay"


@dataclass(frozen=True)
class Move:
    """A reshard in progress from generation ``gen``; ``left``: old shards still open."""

    gen: int
    shards: int
    switched: bool = False
    closed: tuple[int, ...] = ()
    by: str = ""

    @property
    def left(self) -> list[int]:
        return [s for s in range(self.shards) if s not in self.closed]


@dataclass(frozen=True)
class Retired:
    """An ended move's old generation; ``left``: its queues not deleted yet."""

    gen: int
    shards: int
    deleted: tuple[int, ...] = ()

    @property
    def left(self) -> list[int]:
        return [s for s in range(self.shards) if s not in self.deleted]


@dataclass(frozen=True)
class WorkerLayout:
    """One worker's layout: generation ``gen`` with ``shards`` shards."""

    gen: int
    shards: int
    trust: float = TRUST_SECONDS
    moving: Move | None = None
    retired: tuple[Retired, ...] = ()

    @property
    def state(self) -> str:
        if self.moving is None:
            return "stable"
        return "switched" if self.moving.switched else "announced"

    def to_value(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_value(cls, name: str, value: Mapping[str, Any]) -> WorkerLayout:
        try:
            m, gen = value.get("moving"), _count(value["gen"], 0)
            moving = None
            if m is not None:
                n = _count(m["shards"])
                if not isinstance(m["switched"], bool):
                    raise ValueError(f"switched {m['switched']!r}")
                moving = Move(
                    _count(m["gen"], 0, gen - 1), n, m["switched"],
                    tuple(_count(s, 0, n - 1) for s in m["closed"]), str(m.get("by", "")),
                )  # fmt: skip
            retired = tuple(_retired(r, gen) for r in value.get("retired", []))
            # an old generation is older than the live one, and named once: a node sweeps
            # (relays, then deletes) the queues of a retired one
            olds = [r.gen for r in retired] + ([moving.gen] if moving else [])
            if len(set(olds)) < len(olds):
                raise ValueError(f"old generations {olds} (each is there once)")
            trust = value["trust"]
            if isinstance(trust, bool) or not isinstance(trust, (int, float)) or trust <= 0:
                raise ValueError(f"trust {trust!r}")
            return cls(gen, _count(value["shards"]), float(trust), moving, retired)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            damaged = f"the stored layout of {name} is damaged ({why})"
            raise LayoutError(f"{damaged}; {repair(name)}") from None


def repair(worker: str) -> str:
    """What to do about a damaged ``layout/<worker>`` item: no layout is ever guessed."""
    return (
        f"shardq does not guess the layout of {worker}: write back the value the item "
        f"layout/{worker} had in the state store (a JSON object: gen, shards, trust, moving, "
        f"retired; gen is the highest @<gen> in the names of the queues of {worker}), or delete "
        f"it only if {worker} was never resharded (the code's shards are then recorded)"
    )


def _retired(value: Mapping[str, Any], gen: int) -> Retired:
    n = _count(value["shards"])
    return Retired(
        _count(value["gen"], 0, gen - 1), n, tuple(_count(s, 0, n - 1) for s in value["deleted"])
    )


def _count(value: Any, low: int = 1, high: int = MAX_SHARDS) -> int:
    problem = int_in(low, high)(value)
    if problem:
        raise ValueError(problem)
    return int(value)


def announce(
    layout: WorkerLayout, worker: str, shards: int, trust: float, by: str = ""
) -> WorkerLayout:
    if SETTING_CHECKS["shards"](shards):
        raise LayoutError(f"--shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}")
    if layout.moving is not None:
        m = layout.moving
        raise LayoutError(
            f"a reshard of {worker} from {m.shards} to {layout.shards} shards is in progress "
            f"({len(m.left)} of {m.shards} old shards still open); wait until it ends "
            "(shardq stats shows it) and run this again"
        )
    if shards == layout.shards:
        raise LayoutError(f"{worker} already has {shards} shards; nothing to do")
    gen = max([layout.gen, *(r.gen for r in layout.retired)]) + 1
    move = Move(layout.gen, layout.shards, by=by)
    # a copy read before this write is trusted for layout.trust: never shorten it
    return replace(layout, gen=gen, shards=shards, trust=max(trust, layout.trust), moving=move)


def switch(layout: WorkerLayout, gen: int) -> WorkerLayout:
    if layout.moving is None or layout.gen != gen or layout.moving.switched:
        return layout
    return replace(layout, moving=replace(layout.moving, switched=True))


def close(layout: WorkerLayout, gen: int, shard: int) -> WorkerLayout:
    """The last old shard closed retires ``gen``."""
    move = layout.moving
    if move is None or move.gen != gen or not move.switched or shard in move.closed:
        return layout
    move = replace(move, closed=tuple(sorted({*move.closed, shard})))
    if move.left:
        return replace(layout, moving=move)
    return replace(layout, moving=None, retired=(*layout.retired, Retired(move.gen, move.shards)))


def deleted(layout: WorkerLayout, gen: int, shard: int) -> WorkerLayout:
    kept = []
    for old in layout.retired:
        if old.gen == gen:
            old = replace(old, deleted=tuple(sorted({*old.deleted, shard})))
        if old.left:
            kept.append(old)
    return replace(layout, retired=tuple(kept))


def may_switch(layout: WorkerLayout, observed: float, now: float) -> bool:
    """Whether a process that observed the announce at ``observed`` may switch."""
    return layout.state == "announced" and now - observed >= layout.trust


def may_close(layout: WorkerLayout, gen: int, shard: int, observed: float, now: float) -> bool:
    """Whether an old shard found empty may close, by a node that saw the switch then."""
    move = layout.moving
    return (
        move is not None
        and move.switched
        and gen == move.gen
        and shard not in move.closed
        and now - observed >= layout.trust + SWITCH_MARGIN_SECONDS
    )


def may_delete(observed: float, now: float, trust: float) -> bool:
    return now - observed >= 2 * trust


def route(layout: WorkerLayout, gen: int, shard: int, entity: str) -> str:
    """:data:`RUN` a job of ``entity`` received from ``shard`` of ``gen``, :data:`WAIT`
    (hold it, in order) or :data:`RELAY` it to the current generation."""
    move = layout.moving
    if gen == layout.gen:
        if move is not None and shard_for(entity, move.shards) not in move.closed:
            return WAIT  # its entity may still have jobs in the old layout
        return RUN
    if move is not None and gen == move.gen:
        return RUN if shard not in move.closed else RELAY
    if gen < layout.gen:
        return RELAY  # retired
    return WAIT  # a generation newer than this copy: look again


def publish_to(layout: WorkerLayout) -> tuple[int, int]:
    """``(gen, shards)`` a job goes to: the old layout until the switch."""
    move = layout.moving
    if move is not None and not move.switched:
        return move.gen, move.shards
    return layout.gen, layout.shards
