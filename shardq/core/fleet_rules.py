"""The fleet's decisions: pure functions over one node's snapshot of the state store
and when it first saw each heartbeat counter on its own monotonic clock."""

from __future__ import annotations

from collections.abc import Mapping, Set
from contextlib import suppress
from dataclasses import dataclass, field

from shardq.core.assign import assign
from shardq.core.topology import parse_key, shard_key

ELASTIC, STATIC = "elastic", "static"
#: Seconds between two rounds (two prefix queries) of an elastic node.
ROUND_SECONDS = 1.0
#: A heartbeat marked gone is deleted (and left out of views) after this long.
GONE_KEPT_SECONDS = 3600.0
#: Node -> (heartbeat counter, when this observer first saw it).
Seen = Mapping[str, tuple[int, float]]


def timing(lease_seconds: float) -> tuple[float, float]:
    """``(beat, expire)``: a node killed just after a beat is seen dead ``expire`` after
    the next round and its shards taken the round after, within ``lease_seconds``."""
    beat = lease_seconds / 5
    return beat, lease_seconds - beat - 2 * ROUND_SECONDS


@dataclass(frozen=True)
class Beat:
    """A heartbeat as read; ``gone`` is why an observer marked it gone, else ""."""

    node: str
    counter: int
    mode: str = ELASTIC
    gone: str = ""


@dataclass(frozen=True)
class Owner:
    key: str
    node: str  # "" once freed
    version: int


def observe(seen: Seen, beats: Mapping[str, Beat], now: float) -> dict[str, tuple[int, float]]:
    """``seen`` after reading ``beats`` at ``now``: an unmoved counter keeps its time."""
    return {
        node: old if (old := seen.get(node)) and old[0] == beat.counter else (beat.counter, now)
        for node, beat in beats.items()
    }


def unreadable_owner(
    key: str, me: str, held: Mapping[str, Set[str]], live: Set[str], stood: float, expire: float
) -> str | None:
    """Owner of shard ``key`` whose ownership item cannot be read: this node if it holds
    it (it rewrites the item), else the live node whose heartbeat ``held`` lists it, else
    nobody ("": claimed, and so rewritten, as a freed one is) once the item ``stood``
    unchanged ``expire`` seconds, time enough for a live owner to show it or rewrite it;
    None until then: the shard is left alone."""
    if key in held.get(me, ()):
        return me
    holder = next((node for node in sorted(live) if key in held.get(node, ())), None)
    return holder if holder is not None else "" if stood >= expire else None


def _still(beats: Mapping[str, Beat], seen: Seen, now: float, expire: float) -> dict[str, bool]:
    """Node not marked gone -> whether its counter stood still ``expire`` s or more."""
    return {n: now - seen[n][1] >= expire for n, b in beats.items() if not b.gone and n in seen}


def live_nodes(beats: Mapping[str, Beat], seen: Seen, now: float, expire: float) -> set[str]:
    """The elastic nodes whose counter moved less than ``expire`` seconds ago."""
    still = _still(beats, seen, now, expire)
    return {n for n, dead in still.items() if not dead and beats[n].mode == ELASTIC}


def expired(beats: Mapping[str, Beat], seen: Seen, now: float, expire: float) -> list[str]:
    """The nodes an observer marks gone (a conditional write on the counter it saw)."""
    return sorted(n for n, dead in _still(beats, seen, now, expire).items() if dead)


@dataclass(frozen=True)
class Moves:
    """One node's moves in one round (shard keys; versions to write on)."""

    claim: Mapping[str, int | None] = field(default_factory=dict)  # None: no item yet
    serve: tuple[str, ...] = ()  # owned here, not served yet
    free: Mapping[str, int] = field(default_factory=dict)  # owned here, meant elsewhere
    lost: tuple[str, ...] = ()  # served here, owned elsewhere: stop at once
    purge: Mapping[str, int] = field(default_factory=dict)  # ended generations, dead owners


def decide(
    me: str,
    shards: Mapping[str, int],
    live: Set[str],
    owners: Mapping[str, Owner],
    serving: Set[str],
    busy: Set[str] = frozenset(),
) -> Moves:
    """This node's moves. ``shards``: generation name -> count of the live layout;
    ``serving``: keys served here; ``busy``: keys left alone (draining or refused)."""
    live = set(live) | {me}
    parsed = {}
    for key in owners:
        with suppress(ValueError):  # a damaged key is ignored
            parsed[key] = parse_key(key)
    holders = {
        parsed[k]: held.node for k, held in owners.items() if k in parsed and held.node in live
    }
    goal = {shard_key(w, n): node for (w, n), node in assign(shards, sorted(live), holders).items()}
    claim: dict[str, int | None] = {}
    serve = []
    for key in (k for k, node in goal.items() if node == me and k not in busy):
        owner = owners.get(key)
        if owner is None or owner.node not in live:
            claim[key] = None if owner is None else owner.version
        elif owner.node == me and key not in serving:
            serve.append(key)
    workers = {name.partition("@")[0] for name in shards}
    ours = [
        k for k in owners if k not in busy and k.rpartition(":")[0].partition("@")[0] in workers
    ]
    free = {
        k: owners[k].version
        for k in ours
        if owners[k].node == me and k in parsed and goal.get(k) != me
    }
    lost = sorted(k for k in serving if k in owners and owners[k].node != me and k not in busy)
    purge = {k: owners[k].version for k in ours if k not in goal and owners[k].node not in live}
    return Moves(claim, tuple(serve), free, tuple(lost), purge)
