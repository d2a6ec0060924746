"""The live layout: how many shards each worker has now, and a reshard in progress.

A worker class's ``shards`` is its *initial* layout (generation 0). ``shardq reshard``
records a new generation in the app's layout document (:mod:`shardq.layouts`), and
from then on the document, not the code, says where an entity's jobs go. Queues of
generation 0 keep their names (``Orders-3.fifo``); generation ``g`` > 0 adds ``-g{g}``
(``Orders-g1-3.fifo``). In fleet documents and leases a shard of generation ``g`` is
``Orders@g:3``.

A reshard from ``A`` (the old generation) to ``B`` (the new one) moves in one
direction only; every decision is a pure function of the document (:func:`route`):

1. **Announced.** For the move's ``trust`` seconds (:data:`TRUST_SECONDS` by default)
   publishers still send to ``A``, and learn of the move: they look at the document
   at least every ``layout_refresh_seconds`` before sending.
2. **Switched.** From ``started + trust`` on (the *switch time*, the same for every
   publisher) publishers send to ``B``; nodes run ``A`` as before. A job in ``B``
   runs only once its entity's ``A`` shard is *closed*; until then the node holds it
   (in flight, in order) and looks again.
3. **Closing.** An ``A`` shard closes once :data:`SWITCH_MARGIN_SECONDS` after the
   switch time (for clocks that differ and sends in progress) it has been seen empty,
   nothing waiting or in flight, twice :data:`CLOSE_CONFIRM_SECONDS` apart by the
   node holding it. From then on ``A``'s shard *relays*: whatever still reaches it (a
   publish that began with the old layout and lasted past the bound) is sent on to
   ``B`` and deleted, never run in ``A``. So an entity's new jobs wait only until
   the backlog of its old shard at the switch has run, plus about 10 s.

   An old shard that does not empty because a few entities are stuck in it (a job
   failing and retrying) is *narrowed* instead: once the node holding it has seen,
   twice, that every job left in it is one this node holds or hid for a retry, it
   records those jobs' entities as the shard's ``pending`` ones. The shard is then
   closed to every other entity (their new jobs run, late jobs of theirs are
   relayed) and open to the pending ones only, until it empties and closes.
4. **Done.** When the last ``A`` shard closes, the move ends: ``A`` is *retired*. Its
   queues keep relaying until each is deleted, empty, :data:`RETIRE_GRACE_SECONDS`
   after the move ended (by the node holding it, or ``shardq queues ensure --prune``).

So an entity's jobs in ``A`` all finish (succeed or reach the morgue) before any of
its jobs in ``B`` starts, and nothing is left behind in a retired queue.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shardq.errors import ConfigError, LayoutError
from shardq.sharding import shard_for
from shardq.worker import MAX_SHARDS

#: The document format this shardq writes and reads.
FORMAT = 1
#: Publishers look at the layout document again when their copy is older than this
#: (the default of the config's ``layout_refresh_seconds``).
PUBLISHER_REFRESH_SECONDS = 10.0
#: Nodes look at it this often while a reshard is in progress (else every
#: :data:`PUBLISHER_REFRESH_SECONDS`).
NODE_REFRESH_SECONDS = 2.0
#: After a move begins, no publisher sends to the old layout after this long (its
#: copy is at most PUBLISHER_REFRESH_SECONDS old when a send starts; the rest is for
#: the send itself, retries included). The documented bound for learning a layout
#: (the default of the config's ``reshard_trust_seconds``; a move records its own).
TRUST_SECONDS = 60.0
#: An old shard closes after two looks this far apart that found it empty.
CLOSE_CONFIRM_SECONDS = 5.0
#: Old shards are looked at no sooner than this after the switch time.
SWITCH_MARGIN_SECONDS = 5.0
#: A retired queue is deleted, once empty, this long after its move ended (twice the
#: move's trust window; this for the default one).
RETIRE_GRACE_SECONDS = 120.0

RUN, WAIT, RELAY = "run", "wait", "relay"


@dataclass(frozen=True)
class Move:
    """A reshard in progress: from generation ``gen`` with ``shards`` shards."""

    gen: int
    shards: int
    started: float
    closed: tuple[int, ...] = ()  # old shards closed (they relay)
    by: str = ""
    trust: float = 60.0  # publishers switch to the new layout this long after ``started``
    #: Old shards closed to every entity but these (which still have jobs there).
    pending: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def open_for(self, shard: int, entity: str) -> bool:
        """Whether old shard ``shard`` may still hold jobs of ``entity``."""
        if shard in self.closed:
            return False
        waiting = self.pending.get(shard)
        return waiting is None or entity in waiting

    @property
    def switch(self) -> float:
        """The switch time: publishers send to the new layout from then on."""
        return self.started + self.trust

    @property
    def left(self) -> list[int]:
        """Old shards not closed yet."""
        closed = set(self.closed)
        return [s for s in range(self.shards) if s not in closed]


@dataclass(frozen=True)
class Retired:
    """An old generation whose move ended; ``deleted`` lists its queues gone."""

    gen: int
    shards: int
    ended: float
    deleted: tuple[int, ...] = ()
    grace: float = 120.0  # queues are deleted no sooner than this after ``ended``

    @property
    def left(self) -> list[int]:
        deleted = set(self.deleted)
        return [s for s in range(self.shards) if s not in deleted]


@dataclass(frozen=True)
class WorkerLayout:
    """One worker's layout: generation ``gen`` with ``shards`` shards."""

    gen: int
    shards: int
    since: float = 0.0
    moving: Move | None = None
    retired: tuple[Retired, ...] = ()

    def generations(self) -> dict[int, int]:
        """Every generation with queues that must be served: gen -> shards."""
        gens = {self.gen: self.shards}
        if self.moving is not None:
            gens[self.moving.gen] = self.moving.shards
        for old in self.retired:
            if old.left:
                gens[old.gen] = old.shards
        return gens

    def served(self, gen: int) -> list[int]:
        """Shards of ``gen`` still to serve (a retired one's deleted queues are not)."""
        for old in self.retired:
            if old.gen == gen:
                return old.left
        return list(range(self.generations().get(gen, 0)))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gen": self.gen, "shards": self.shards, "since": self.since}
        if self.moving is not None:
            m = self.moving
            data["moving"] = {
                "gen": m.gen,
                "shards": m.shards,
                "started": m.started,
                "closed": list(m.closed),
                "by": m.by,
                "trust": m.trust,
                "pending": {str(k): list(v) for k, v in sorted(m.pending.items())},
            }
        data["retired"] = [
            {
                "gen": r.gen,
                "shards": r.shards,
                "ended": r.ended,
                "deleted": list(r.deleted),
                "grace": r.grace,
            }
            for r in self.retired
        ]
        return data

    @classmethod
    def from_json(cls, name: str, data: Any) -> WorkerLayout:
        obj = _object(data, f"worker {name}")
        moving = None
        if obj.get("moving") is not None:
            m = _object(obj["moving"], f"worker {name}'s move")
            moving = Move(
                _int(m, "gen", name),
                _shards(m, name),
                _float(m, "started", name),
                tuple(_ints(m, "closed", name)),
                str(m.get("by", "")),
                _float(m, "trust", name, TRUST_SECONDS),
                _pending(m, name),
            )
        retired = []
        for item in obj.get("retired", []) or []:
            r = _object(item, f"worker {name}'s retired generation")
            retired.append(
                Retired(
                    _int(r, "gen", name),
                    _shards(r, name),
                    _float(r, "ended", name),
                    tuple(_ints(r, "deleted", name)),
                    _float(r, "grace", name, RETIRE_GRACE_SECONDS),
                )
            )
        return cls(
            _int(obj, "gen", name),
            _shards(obj, name),
            _float(obj, "since", name),
            moving,
            tuple(retired),
        )


@dataclass(frozen=True)
class LayoutDoc:
    """Every worker that was ever resharded (others are at their code's layout)."""

    version: int = 0
    written: float = 0.0
    workers: Mapping[str, WorkerLayout] = field(default_factory=dict)

    def to_text(self) -> str:
        data = {
            "format": FORMAT,
            "version": self.version,
            "written": self.written,
            "workers": {n: w.to_json() for n, w in sorted(self.workers.items())},
        }
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> LayoutDoc:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LayoutError(f"the layout document is not JSON: {exc}") from None
        obj = _object(data, "the layout document")
        fmt = obj.get("format")
        if not isinstance(fmt, int) or isinstance(fmt, bool):
            raise LayoutError("the layout document has no format number")
        if fmt > FORMAT:
            raise LayoutError(
                f"the layout document has format {fmt}, newer than this shardq reads "
                f"({FORMAT}): upgrade shardq on this machine"
            )
        workers = _object(obj.get("workers", {}), "the layout document's workers")
        return cls(
            version=_int(obj, "version", "the document"),
            written=_float(obj, "written", "the document"),
            workers={str(n): WorkerLayout.from_json(str(n), w) for n, w in workers.items()},
        )


def current(doc: LayoutDoc | None, worker: str, code_shards: int) -> WorkerLayout:
    """``worker``'s layout: the document's, else generation 0 with the code's shards."""
    if doc is not None and worker in doc.workers:
        return doc.workers[worker]
    return WorkerLayout(0, code_shards)


# -- transitions (pure) ----------------------------------------------------------------
def start(
    layout: WorkerLayout,
    worker: str,
    shards: int,
    now: float,
    by: str,
    trust: float = TRUST_SECONDS,
) -> WorkerLayout:
    """``layout`` with a move to ``shards`` begun; raises :class:`LayoutError` if refused.
    Old shards close no sooner than ``trust`` seconds from ``now``."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
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
    move = Move(layout.gen, layout.shards, now, (), by, trust)
    return replace(layout, gen=gen, shards=shards, since=now, moving=move)


def narrow(layout: WorkerLayout, shard: int, entities: Collection[str]) -> WorkerLayout:
    """``layout`` with old shard ``shard`` closed to every entity but ``entities`` (those
    that still have jobs in it); narrowing again keeps only entities in both sets."""
    move = layout.moving
    if move is None or shard in move.closed:
        return layout
    keep = set(entities)
    if shard in move.pending:
        keep &= set(move.pending[shard])
    pending = {**move.pending, shard: tuple(sorted(keep))}
    return replace(layout, moving=replace(move, pending=pending))


def close(layout: WorkerLayout, shard: int, now: float) -> WorkerLayout:
    """``layout`` with old shard ``shard`` closed; the move ends with its last shard."""
    move = layout.moving
    if move is None or shard in move.closed:
        return layout
    pending = {k: v for k, v in move.pending.items() if k != shard}
    move = replace(move, closed=tuple(sorted({*move.closed, shard})), pending=pending)
    if move.left:
        return replace(layout, moving=move)
    retired = (*layout.retired, Retired(move.gen, move.shards, now, (), 2 * move.trust))
    return replace(layout, moving=None, retired=retired)


def deleted(layout: WorkerLayout, gen: int, shard: int) -> WorkerLayout:
    """``layout`` after retired queue ``shard`` of ``gen`` was deleted."""
    kept = []
    for old in layout.retired:
        if old.gen == gen:
            old = replace(old, deleted=tuple(sorted({*old.deleted, shard})))
        if old.left:
            kept.append(old)
    return replace(layout, retired=tuple(kept))


# -- decisions (pure) ------------------------------------------------------------------
def route(layout: WorkerLayout, gen: int, shard: int, entity: str) -> str:
    """What a node does with a job of ``entity`` received from shard ``shard`` of
    generation ``gen``: :data:`RUN` it, :data:`WAIT` (hold it, in order, and look
    again) or :data:`RELAY` it to the current generation."""
    move = layout.moving
    if gen == layout.gen:
        if move is not None and move.open_for(shard_for(entity, move.shards), entity):
            return WAIT  # its entity may still have jobs in the old layout
        return RUN
    if move is not None and gen == move.gen:
        return RUN if move.open_for(shard, entity) else RELAY
    if gen < layout.gen:
        return RELAY  # retired
    return WAIT  # a generation newer than this copy of the document: look again


def publish_to(layout: WorkerLayout, now: float) -> tuple[int, int]:
    """``(generation, shards)`` a job published at ``now`` goes to: the old layout
    until the move's switch time, then the new one."""
    move = layout.moving
    if move is not None and now < move.switch:
        return move.gen, move.shards
    return layout.gen, layout.shards


def may_close(layout: WorkerLayout, gen: int, shard: int, now: float) -> bool:
    """Whether old shard ``shard`` of ``gen`` may close once seen empty: every publisher
    has switched (with a margin for clocks and sends in progress)."""
    move = layout.moving
    return (
        move is not None
        and gen == move.gen
        and shard not in move.closed
        and now >= move.switch + SWITCH_MARGIN_SECONDS
    )


def may_delete(layout: WorkerLayout, gen: int, shard: int, now: float) -> bool:
    """Whether retired queue ``shard`` of ``gen`` may be deleted once seen empty."""
    return any(
        old.gen == gen and shard in old.left and now - old.ended >= old.grace
        for old in layout.retired
    )


def shard_name(worker: str, gen: int) -> str:
    """The name of a generation in shard keys: ``Orders`` (0), ``Orders@2``."""
    return worker if gen == 0 else f"{worker}@{gen}"


def parse_name(name: str) -> tuple[str, int]:
    """``"Orders@2"`` as ``("Orders", 2)``; ``"Orders"`` as ``("Orders", 0)``."""
    worker, at, gen = name.rpartition("@")
    if not at:
        return name, 0
    if not (gen.isascii() and gen.isdigit()) or not worker:
        raise ConfigError(f"{name!r} is not a worker name with a generation (Orders@2)")
    return worker, int(gen)


# -- parsing helpers ---------------------------------------------------------------------
def _object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise LayoutError(f"{what} in the layout document is not an object")
    return data


def _int(obj: Mapping[str, Any], key: str, what: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LayoutError(f"{what}: {key!r} in the layout document is not an int >= 0")
    return value


def _shards(obj: Mapping[str, Any], what: str) -> int:
    value = _int(obj, "shards", what)
    if not 1 <= value <= MAX_SHARDS:
        raise LayoutError(f"{what}: shards {value} in the layout document is not 1..{MAX_SHARDS}")
    return value


def _float(obj: Mapping[str, Any], key: str, what: str, default: float = 0.0) -> float:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LayoutError(f"{what}: {key!r} in the layout document is not a number")
    return float(value)


def _pending(obj: Mapping[str, Any], what: str) -> dict[int, tuple[str, ...]]:
    value = obj.get("pending", {}) or {}
    if not isinstance(value, dict):
        raise LayoutError(f"{what}: 'pending' in the layout document is not an object")
    pending = {}
    for key, entities in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise LayoutError(
                f"{what}: pending shard {key!r} in the layout document is not a number"
            )
        if not isinstance(entities, list) or not all(isinstance(e, str) for e in entities):
            raise LayoutError(f"{what}: pending[{key}] in the layout document is not a list of ids")
        pending[int(key)] = tuple(entities)
    return pending


def _ints(obj: Mapping[str, Any], key: str, what: str) -> list[int]:
    values = obj.get(key, []) or []
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise LayoutError(f"{what}: {key!r} in the layout document is not a list of ints")
    return values
