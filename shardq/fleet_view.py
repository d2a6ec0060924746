"""What operators see of a fleet: the live nodes, the nodes gone in the last hour, and
which node serves each shard with what lag.

Pure: a :class:`~shardq.fleet_doc.FleetDoc` (or None: no node ever reported) and a
time in, a :class:`FleetView` out. ``shardq nodes``, ``shardq stats`` and the
dashboard all show this view.

* A node listed as live whose last report is older than its ``stale_after`` (60 s,
  or 15 s past its next report's due time) is shown gone (``not reporting``, since
  its last report), even before another node has moved it to ``gone`` in the
  document. Nodes report about every 45 s, idle elastic nodes every 90 s.
* Gone nodes are shown for :data:`~shardq.fleet_doc.GONE_KEPT_SECONDS` after they went.
* A shard's owner is the live node whose report says it holds the shard (the latest
  report wins; None if no live node reports it), and its lag is what that owner
  reported for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardq.errors import ConfigError
from shardq.fleet_doc import GONE_KEPT_SECONDS, FleetDoc, NodeReport
from shardq.layout import parse_name, shard_name

#: Why a node that stopped reporting without saying so is shown gone.
NOT_REPORTING = "not reporting"


def shard_key(worker: str, shard: int, gen: int = 0) -> str:
    """The key of a shard in the fleet document: ``"Orders:3"`` (generation 0),
    ``"Orders@2:3"`` (generation 2)."""
    return f"{shard_name(worker, gen)}:{shard}"


def key_order(key: str) -> tuple[str, int, int, str]:
    """Sort key for shard keys: by worker, then generation, then shard number (a key
    of another shape sorts by its text, after its worker's)."""
    name, _, shard = key.rpartition(":")
    try:
        worker, gen = parse_name(name)
    except ConfigError:
        return (key, -1, -1, key)
    if not (shard.isascii() and shard.isdigit()):
        return (key, -1, -1, key)
    return (worker, gen, int(shard), "")


@dataclass(frozen=True)
class GoneView:
    """A node gone in the last hour: its last report, when and why it went, and the
    shards it held that no live node reports holding yet (``unserved``)."""

    report: NodeReport
    gone_at: float
    reason: str
    unserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetView:
    """The fleet at ``time``. ``reported`` is False when no node ever wrote a report."""

    time: float
    reported: bool = False
    #: Live nodes, by node id.
    nodes: tuple[NodeReport, ...] = ()
    #: Nodes gone in the last hour, the latest first.
    gone: tuple[GoneView, ...] = ()
    #: Shard key -> the live node holding it.
    owners: Mapping[str, str] = field(default_factory=dict)
    #: Shard key -> the lag its owner reported, in seconds.
    lags: Mapping[str, float] = field(default_factory=dict)

    @property
    def jobs_per_second(self) -> float:
        """The live nodes' jobs per second together, as they last reported."""
        return sum(n.jobs_per_second for n in self.nodes)

    def owner(self, worker: str, shard: int, gen: int = 0) -> str | None:
        return self.owners.get(shard_key(worker, shard, gen))

    def lag(self, worker: str, shard: int, gen: int = 0) -> float | None:
        return self.lags.get(shard_key(worker, shard, gen))

    def gone_since(self, since: float) -> tuple[GoneView, ...]:
        """The nodes that went at ``since`` or later."""
        return tuple(g for g in self.gone if g.gone_at >= since)

    def to_json(self) -> dict[str, Any]:
        """``{"time", "nodes": [...], "gone": [...]}``, as ``shardq nodes --json`` prints."""
        return {
            "time": self.time,
            "nodes": [_node_json(n) for n in self.nodes],
            "gone": [
                {
                    **_node_json(g.report),
                    "gone_at": g.gone_at,
                    "reason": g.reason,
                    "unserved": list(g.unserved),
                }
                for g in self.gone
            ],
        }


def fleet_view(doc: FleetDoc | None, now: float) -> FleetView:
    """What operators see of ``doc`` at ``now``."""
    if doc is None:
        return FleetView(now)
    live = [r for r in doc.nodes.values() if now - r.seen <= r.stale_after]
    owners: dict[str, str] = {}
    lags: dict[str, float] = {}
    for report in sorted(live, key=lambda r: r.seen):  # the latest report wins
        for key in report.held:
            owners[key] = report.node
            if key in report.lags:
                lags[key] = float(report.lags[key])
            else:
                lags.pop(key, None)
    live_ids = {r.node for r in live}
    went = [(r, r.seen, NOT_REPORTING) for r in doc.nodes.values() if r.node not in live_ids]
    went += [(g.report, g.gone_at, g.reason) for k, g in doc.gone.items() if k not in doc.nodes]
    gone = [
        GoneView(report, at, reason, _sorted(k for k in report.held if k not in owners))
        for report, at, reason in went
        if now - at <= GONE_KEPT_SECONDS and report.node not in live_ids
    ]
    return FleetView(
        time=now,
        reported=True,
        nodes=tuple(sorted(live, key=lambda r: r.node)),
        gone=tuple(sorted(gone, key=lambda g: (-g.gone_at, g.report.node))),
        owners=owners,
        lags=lags,
    )


def _sorted(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(keys), key=key_order))


def _node_json(report: NodeReport) -> dict[str, Any]:
    return {
        "node": report.node,
        "host": report.host,
        "pid": report.pid,
        "mode": report.mode,
        "version": report.version,
        "threads": report.threads,
        "started": report.started,
        "seen": report.seen,
        "shards": len(set(report.held)),
        "held": list(_sorted(report.held)),
        "jobs_per_second": report.jobs_per_second,
        "done": report.done,
        "max_lag": report.max_lag,
    }
