"""The fleet's decisions, as pure functions of a fleet document and the time.

* :func:`joined`: a node's periodic write: its report in, nodes it saw go and nodes
  silent for :data:`STALE_SECONDS` moved to gone, targets recomputed;
* :func:`left`: a node's last write when it stops;
* :func:`retarget`: the node that should hold each shard (:func:`shardq.assign.assign`
  over the elastic nodes, starting from who reports holding what);
* :func:`take_lease`: whether a node keeps a shard lease it received.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from shardq.assign import assign, key_text, parse_key
from shardq.fleet_doc import ELASTIC, FleetDoc, NodeReport

#: A lease that keeps coming back to a node this long is taken even if targeted
#: elsewhere (its target is not picking it up).
BOUNCE_GIVE_UP_SECONDS = 5.0


def shard_keys(shards: Mapping[str, int]) -> list[str]:
    """``worker:n`` of every shard, ordered by worker then shard."""
    return [f"{name}:{n}" for name in sorted(shards) for n in range(shards[name])]


def joined(
    doc: FleetDoc,
    report: NodeReport,
    gone: Mapping[str, str],
    now: float,
    shards: Mapping[str, int],
) -> FleetDoc:
    """``doc`` after ``report``'s node wrote its report (``gone``: node -> reason)."""
    doc = doc.pruned(now).with_node(report)
    for node, reason in gone.items():
        doc = doc.without_node(node, reason, now)
    for node, other in list(doc.nodes.items()):
        if node != report.node and now - other.seen > other.stale_after:
            doc = doc.without_node(node, "not reporting", now)
    return retarget(doc, shards)


def left(doc: FleetDoc, node: str, now: float, shards: Mapping[str, int]) -> FleetDoc:
    """``doc`` after ``node`` stopped gracefully."""
    return retarget(doc.without_node(node, "stopped", now), shards)


def retarget(doc: FleetDoc, shards: Mapping[str, int]) -> FleetDoc:
    """Targets recomputed over the elastic nodes; every shard listed as leased."""
    elastic = sorted(n for n, r in doc.nodes.items() if r.mode == ELASTIC)
    holders = {}
    for key, node in doc.owners().items():
        try:
            holders[parse_key(key)] = node
        except ValueError:
            continue
    targets = {key_text(k): n for k, n in assign(shards, elastic, holders).items()}
    leases = tuple(sorted({*_listed(doc.leases, shards), *shard_keys(shards)}))
    return replace(doc, targets=targets, leases=leases)


def _listed(leases: tuple[str, ...], shards: Mapping[str, int]) -> list[str]:
    """Listed leases to keep: not those of a layout generation that ended (a worker
    whose other generation is live); those of workers unknown here are kept."""
    workers = {name.partition("@")[0] for name in shards}
    kept = []
    for key in leases:
        name = key.rpartition(":")[0]
        if name in shards or name.partition("@")[0] not in workers:
            kept.append(key)
    return kept


def take_lease(key: str, me: str, doc: FleetDoc, live: set[str], bounced_for: float | None) -> bool:
    """Whether a node that received the lease of ``key`` keeps it: yes if targeted at
    it, at nobody, at a node not live, or at the node that reported holding it (which
    let it lapse: killed, cut off, or leaving, before the others know); else only once
    it has bounced long enough."""
    target = doc.targets.get(key)
    if target is None or target == me or target not in live:
        return True
    holder = doc.nodes.get(target)
    if holder is not None and key in holder.held:
        return True
    return bounced_for is not None and bounced_for >= BOUNCE_GIVE_UP_SECONDS
