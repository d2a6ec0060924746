"""What operators see of a fleet: live nodes, nodes gone in the last hour, which node
serves each shard with what lag, and the shards no live node serves.

Built from the state store's fleet items (:mod:`shardq.fleet`): the heartbeats
(``node/<id>``, each node's report) and the ownership items (``shard/<key>``).
``shardq nodes``, ``shardq stats``, ``/api/v1/nodes`` and the dashboard show it.

* A heartbeat that a live node marked gone (its counter stood still for the lease,
  on that node's clock) is shown gone with the reason; a node that left gracefully
  deleted its heartbeat and is not shown.
* When no elastic node's heartbeat is recent by this machine's clock (nobody is left
  to mark the others gone), a heartbeat older than :func:`stale_after` is shown
  gone, ``not reporting``: for display only; nothing decides on it.
* A shard's owner is the live node of its ownership item (a static node: the shards
  its report lists); ``unserved`` lists the shards of the live layout no live node
  serves. Their lag is unknown to the fleet (never 0): ``shardq stats`` shows the
  broker's age of their oldest job where the broker knows it, and their backlog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardq.core.errors import ConfigError
from shardq.core.fleet_rules import ELASTIC, shard_keys
from shardq.core.layout import parse_name, shard_name
from shardq.store import Item, Store

NOT_REPORTING = "not reporting"
COUNTS = ("done", "retried", "failed")
GONE_KEPT_SECONDS = 3600.0


def shard_key(worker: str, shard: int, gen: int = 0) -> str:
    """``"Orders:3"`` (generation 0), ``"Orders@2:3"`` (generation 2)."""
    return f"{shard_name(worker, gen)}:{shard}"


def key_order(key: str) -> tuple[str, int, int, str]:
    """Sort key for shard keys: by worker, generation, shard number."""
    name, _, shard = key.rpartition(":")
    try:
        worker, gen = parse_name(name)
    except ConfigError:
        return (key, -1, -1, key)
    if not (shard.isascii() and shard.isdigit()):
        return (key, -1, -1, key)
    return (worker, gen, int(shard), "")


@dataclass(frozen=True)
class NodeReport:
    """One node's heartbeat as shown. Times are Unix seconds of the node's clock."""

    node: str
    host: str = ""
    pid: int = 0
    started: float = 0.0
    seen: float = 0.0
    mode: str = ELASTIC
    threads: int = 0
    held: tuple[str, ...] = ()
    lags: Mapping[str, float] = field(default_factory=dict)
    jobs_per_second: float = 0.0
    done: int = 0
    retried: int = 0
    failed: int = 0
    max_lag: float = 0.0
    version: str = ""
    expire: float = 0.0
    concurrency: int | None = None
    #: Jobs running now (execution slots busy), out of ``concurrency``.
    slots_in_use: int | None = None
    #: Worker -> ``{"done", "retried", "failed"}`` since the node started.
    by_worker: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def from_value(cls, node: str, v: Mapping[str, Any]) -> NodeReport:
        raw = v.get("lags")
        raw = raw if isinstance(raw, dict) else {}
        lags = {str(k): float(x) for k, x in raw.items() if isinstance(x, (int, float))}
        held = v.get("held")
        held = held if isinstance(held, list) else []
        return cls(
            node=node,
            host=str(v.get("host", "")),
            pid=_int(v.get("pid")),
            started=_float(v.get("started")),
            seen=_float(v.get("at")),
            mode=str(v.get("mode", ELASTIC)),
            threads=_int(v.get("threads")),
            held=tuple(str(k) for k in held),
            lags=lags,
            jobs_per_second=_float(v.get("jobs_per_second")),
            done=_int(v.get("done")),
            retried=_int(v.get("retried")),
            failed=_int(v.get("failed")),
            max_lag=max(lags.values(), default=0.0),
            version=str(v.get("version", "")),
            expire=_float(v.get("expire")),
            concurrency=_opt_int(v.get("concurrency")),
            slots_in_use=_opt_int(v.get("slots_in_use")),
            by_worker=_worker_counts(v.get("by_worker")),
        )


def stale_after(report: NodeReport) -> float:
    """Seconds after its own time from which a heartbeat is shown ``not reporting``
    when no live node judges it (three leases, at least a minute)."""
    return max(60.0, 3 * report.expire)


@dataclass(frozen=True)
class GoneView:
    """A node gone: its last report, when (the marker's clock) and why, and the shards
    it held that no live node serves yet (``unserved``)."""

    report: NodeReport
    gone_at: float
    reason: str
    unserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetView:
    """The fleet at ``time``. ``reported`` is False when no node ever wrote."""

    time: float
    reported: bool = False
    nodes: tuple[NodeReport, ...] = ()
    gone: tuple[GoneView, ...] = ()
    #: Shard key -> the live node serving it.
    owners: Mapping[str, str] = field(default_factory=dict)
    #: Shard key -> the lag its owner reported, in seconds.
    lags: Mapping[str, float] = field(default_factory=dict)
    #: Keys of the live layout's shards no live node serves (when the layout was given).
    unserved: tuple[str, ...] = ()
    #: Shard key -> the node not live (gone, or no longer reporting) that held it last,
    #: for shards no live node serves.
    last_held: Mapping[str, str] = field(default_factory=dict)

    @property
    def jobs_per_second(self) -> float:
        return sum(n.jobs_per_second for n in self.nodes)

    def counts(self, worker: str | None = None) -> dict[str, int]:
        """Jobs done, retried and failed (morgued) since the live nodes started, from
        their reports (what SQS cannot count): in all, or of one ``worker``."""
        if worker is None:
            per = [{"done": n.done, "retried": n.retried, "failed": n.failed} for n in self.nodes]
        else:
            per = [dict(n.by_worker.get(worker, {})) for n in self.nodes]
        return {k: sum(c.get(k, 0) for c in per) for k in COUNTS}

    @property
    def counted_workers(self) -> tuple[str, ...]:
        """The workers the live nodes' reports count jobs of."""
        return tuple(sorted({w for n in self.nodes for w in n.by_worker}))

    @property
    def no_live_node(self) -> bool:
        """Nodes reported before, and none is live now."""
        return self.reported and not self.nodes

    def owner(self, worker: str, shard: int, gen: int = 0) -> str | None:
        return self.owners.get(shard_key(worker, shard, gen))

    def lag(self, worker: str, shard: int, gen: int = 0) -> float | None:
        return self.lags.get(shard_key(worker, shard, gen))

    def last_holder(self, worker: str, shard: int, gen: int = 0) -> str | None:
        """The node, not live now, that held a shard no live node serves."""
        return self.last_held.get(shard_key(worker, shard, gen))

    def gone_since(self, since: float) -> tuple[GoneView, ...]:
        return tuple(g for g in self.gone if g.gone_at >= since)

    def to_json(self) -> dict[str, Any]:
        """As ``shardq nodes --json`` prints it (and ``/api/v1/nodes`` answers)."""
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
            "unserved": list(self.unserved),
            "no_live_node": self.no_live_node,
        }


@dataclass(frozen=True)
class FleetItems:
    """The fleet's items as read from the store."""

    nodes: tuple[Item, ...] = ()
    owners: tuple[Item, ...] = ()


def read_fleet(store: Store) -> FleetItems:
    """The ownership items, then the heartbeats (two prefix queries)."""
    owners = store.query_all("shard/")
    return FleetItems(tuple(store.query_all("node/")), tuple(owners))


def fleet_view(
    items: FleetItems | None, now: float, shards: Mapping[str, int] | None = None
) -> FleetView:
    """What operators see at ``now``; ``shards`` (generation name -> count of the live
    layout) adds the shards no live node serves."""
    if items is None or not (items.nodes or items.owners):
        return FleetView(now, unserved=_sorted(shard_keys(shards or {})))
    reports = [
        (NodeReport.from_value(i.key.partition("/")[2], i.value), i.value) for i in items.nodes
    ]
    judged = any(  # a live elastic node marks the others gone: trust its marks
        r.mode == ELASTIC and not v.get("gone") and now - r.seen <= stale_after(r)
        for r, v in reports
    )
    live: list[NodeReport] = []
    went: list[tuple[NodeReport, float, str]] = []
    for report, value in reports:
        if value.get("gone"):
            went.append((report, _float(value.get("gone_at")), str(value["gone"])))
        elif not judged and now - report.seen > stale_after(report):
            went.append((report, report.seen, NOT_REPORTING))
        else:
            live.append(report)
    live_ids = {r.node for r in live}
    owners: dict[str, str] = {}
    for report in live:
        if report.mode != ELASTIC:
            owners.update((k, report.node) for k in report.held)
    for item in items.owners:
        owner = str(item.value.get("owner", ""))
        if owner in live_ids:
            owners[item.key.partition("/")[2]] = owner
    last_held: dict[str, str] = {}
    for report, _, _ in sorted(went, key=lambda w: w[1]):  # the latest to go wins
        last_held.update((k, report.node) for k in report.held if k not in owners)
    for item in items.owners:  # an ownership item still naming a node not live
        owner, key = str(item.value.get("owner", "")), item.key.partition("/")[2]
        if owner and owner not in live_ids and key not in owners:
            last_held[key] = owner
    by_id = {r.node: r for r in live}
    lags = {k: float(by_id[n].lags[k]) for k, n in owners.items() if k in by_id[n].lags}
    gone = [
        GoneView(r, at, why, _sorted(k for k in r.held if k not in owners))
        for r, at, why in went
        if now - at <= GONE_KEPT_SECONDS
    ]
    return FleetView(
        time=now,
        reported=True,
        nodes=tuple(sorted(live, key=lambda r: r.node)),
        gone=tuple(sorted(gone, key=lambda g: (-g.gone_at, g.report.node))),
        owners=owners,
        lags=lags,
        unserved=_sorted(k for k in shard_keys(shards or {}) if k not in owners),
        last_held=last_held,
    )


def _sorted(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(keys), key=key_order))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _worker_counts(value: Any) -> dict[str, dict[str, int]]:
    """A report's ``by_worker``; anything malformed in it counts 0."""
    if not isinstance(value, dict):
        return {}
    return {
        str(w): {k: _int(c.get(k)) for k in COUNTS} for w, c in value.items() if isinstance(c, dict)
    }


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else 0.0


def _node_json(report: NodeReport) -> dict[str, Any]:
    data = {
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
        "retried": report.retried,
        "failed": report.failed,
        "by_worker": {w: dict(c) for w, c in sorted(report.by_worker.items())},
        "max_lag": report.max_lag,
    }
    if report.concurrency is not None:
        data["concurrency"] = report.concurrency
    if report.slots_in_use is not None:
        data["slots_in_use"] = report.slots_in_use
    return data
