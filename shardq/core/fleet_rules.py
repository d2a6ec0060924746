"""The fleet's decisions: pure functions over one node's snapshot of the state store.

A snapshot: every heartbeat (``Beat``; its counter is the item's version), every
ownership item (``Owner``, keyed as :attr:`shardq.core.plan.ShardRef.key`) and, per node,
when this observer first saw its counter on its own monotonic clock. Nothing here
compares the wall clocks of two machines.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from contextlib import suppress
from dataclasses import dataclass, field

from shardq.core.assign import ShardKey, assign

ELASTIC, STATIC = "elastic", "static"
#: Seconds between two rounds (two prefix queries) of an elastic node.
ROUND_SECONDS = 1.0


def timing(lease_seconds: float) -> tuple[float, float]:
    """``(beat, expire)``: how often a node bumps its heartbeat counter, and how long
    a counter must stay still, on an observer's clock, before its node counts as dead.
    A node killed just after a beat is seen dead ``expire`` after the next round, and
    its shards taken the round after: within ``lease_seconds`` of its death."""
    beat = lease_seconds / 5
    return beat, lease_seconds - beat - 2 * ROUND_SECONDS


@dataclass(frozen=True)
class Beat:
    """One heartbeat item as read: its node, counter (the item's version), mode and
    whether an observer marked it gone (its reason, else "")."""

    node: str
    counter: int
    mode: str = ELASTIC
    gone: str = ""


@dataclass(frozen=True)
class Owner:
    """One ownership item: the shard's key, its owner and the item's version."""

    key: str
    node: str
    version: int


def observe(
    seen: Mapping[str, tuple[int, float]], beats: Mapping[str, Beat], now: float
) -> dict[str, tuple[int, float]]:
    """Node -> (counter, when first seen) after reading ``beats`` at ``now``: a counter
    seen before keeps its time; a new one (or a new node) is seen now; nodes whose item
    is gone are forgotten."""
    result = {}
    for node, beat in beats.items():
        old = seen.get(node)
        result[node] = old if old is not None and old[0] == beat.counter else (beat.counter, now)
    return result


def live_nodes(
    beats: Mapping[str, Beat], seen: Mapping[str, tuple[int, float]], now: float, expire: float
) -> set[str]:
    """The elastic nodes not marked gone whose counter moved less than ``expire``
    seconds ago (as this observer saw it)."""
    return {
        node
        for node, beat in beats.items()
        if beat.mode == ELASTIC and not beat.gone and node in seen and now - seen[node][1] < expire
    }


def expired(
    beats: Mapping[str, Beat], seen: Mapping[str, tuple[int, float]], now: float, expire: float
) -> list[str]:
    """Nodes not marked gone whose counter stood still ``expire`` seconds or more: an
    observer marks them gone (a conditional write on the counter it saw)."""
    return sorted(
        node
        for node, beat in beats.items()
        if not beat.gone and node in seen and now - seen[node][1] >= expire
    )


@dataclass(frozen=True)
class Moves:
    """What one node does in one round (shard keys; versions to write on)."""

    #: Free or dead-owned shards assigned to this node: key -> version read (None: no item).
    claim: Mapping[str, int | None] = field(default_factory=dict)
    #: Shards this node owns and should serve but does not (yet): serve them.
    serve: tuple[str, ...] = ()
    #: Shards this node owns that another node should hold: drain, then delete.
    free: Mapping[str, int] = field(default_factory=dict)
    #: Shards served here that the store says another node owns: stop at once.
    lost: tuple[str, ...] = ()
    #: Ownership items of ended layout generations, owned by no live node: delete.
    purge: Mapping[str, int] = field(default_factory=dict)


def shard_keys(shards: Mapping[str, int]) -> list[str]:
    """``name:n`` of every shard (``shards``: generation name -> count), sorted."""
    return [f"{name}:{n}" for name in sorted(shards) for n in range(shards[name])]


def parse_key(key: str) -> ShardKey:
    """``"Orders@2:3"`` as ``("Orders@2", 3)`` (the name may contain colons); a key
    no :attr:`~shardq.core.plan.ShardRef.key` writes raises ValueError naming it."""
    name, _, number = key.rpartition(":")
    if not name or not (number.isascii() and number.isdigit()) or number != str(int(number)):
        raise ValueError(f"shard key {key!r} is not 'name:shard', e.g. 'Orders:3'")
    return name, int(number)


def targets(
    shards: Mapping[str, int], live: Set[str], owners: Mapping[str, Owner]
) -> dict[str, str]:
    """Shard key -> the live node that should hold it (:func:`shardq.core.assign.assign`,
    starting from the live owners; damaged keys are ignored)."""
    holders = {}
    for key, owner in owners.items():
        with suppress(ValueError):
            if owner.node in live:
                holders[parse_key(key)] = owner.node
    return {f"{w}:{n}": node for (w, n), node in assign(shards, sorted(live), holders).items()}


def decide(
    me: str,
    shards: Mapping[str, int],
    live: Set[str],
    owners: Mapping[str, Owner],
    serving: Set[str],
    busy: Set[str] = frozenset(),
) -> Moves:
    """This node's moves. ``shards``: generation name -> count of the live layout;
    ``live``: live elastic nodes (this one included); ``serving``: keys served here;
    ``busy``: keys not to touch this round (draining, or refused a moment ago)."""
    live = set(live) | {me}
    goal = targets(shards, live, owners)
    claim: dict[str, int | None] = {}
    serve = []
    for key, node in goal.items():
        if node != me or key in busy:
            continue
        owner = owners.get(key)
        if owner is None or owner.node not in live:
            claim[key] = None if owner is None else owner.version
        elif owner.node == me and key not in serving:
            serve.append(key)
    free = {
        key: o.version
        for key, o in owners.items()
        if o.node == me and goal.get(key) != me and key not in busy
    }
    lost = tuple(
        sorted(k for k in serving if k in owners and owners[k].node != me and k not in busy)
    )
    workers = {name.partition("@")[0] for name in shards}
    purge = {
        key: o.version
        for key, o in owners.items()
        if key not in goal
        and o.node not in live
        and key.rpartition(":")[0].partition("@")[0] in workers
    }
    return Moves(claim, tuple(serve), free, lost, purge)
