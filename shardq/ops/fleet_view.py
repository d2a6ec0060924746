"""The fleet as ``shardq nodes``, ``shardq stats`` and the dashboard show it, from the
heartbeats (``node/<id>``) and ownership items (``shard/<key>``): live nodes, nodes gone
in the last hour, each shard's owner and lag, and the shards no live node serves."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from shardq.core.errors import ConfigError
from shardq.core.fleet_rules import ELASTIC, GONE_KEPT_SECONDS
from shardq.core.heartbeat import COUNTS, Heartbeat, prefix_of
from shardq.core.tables import age, table, utc
from shardq.core.terminal import plural
from shardq.core.topology import parse_name, shard_key, shard_keys
from shardq.store import Item, Store

NOT_REPORTING = "not reporting"
NO_LIVE_NODE = "no live node at all: no shard is served"


def key_order(key: str) -> tuple[str, int, int, str]:
    """Sort key for shard keys: by worker, generation, shard number."""
    name, _, shard = key.rpartition(":")
    with suppress(ConfigError):
        worker, gen = parse_name(name)
        if shard.isascii() and shard.isdigit():
            return (worker, gen, int(shard), "")
    return (key, -1, -1, key)


def stale_after(report: Heartbeat) -> float:
    """Age from which a heartbeat no live node judges is ``not reporting`` (3 leases, >= 60 s)."""
    return max(60.0, 3 * report.expire)


@dataclass(frozen=True)
class GoneView:
    """A node gone: its last report, when (marker's clock), why, and its shards unserved."""

    report: Heartbeat
    gone_at: float
    reason: str
    unserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetView:
    """The fleet at ``time``. ``reported`` is False when no node ever wrote (an item
    that can be read)."""

    time: float
    reported: bool = False
    nodes: tuple[Heartbeat, ...] = ()
    gone: tuple[GoneView, ...] = ()
    owners: Mapping[str, str] = field(default_factory=dict)  # shard key -> live node
    lags: Mapping[str, float] = field(default_factory=dict)  # shard key -> owner's report
    unserved: tuple[str, ...] = ()  # the live layout's shards no live node serves
    #: Shard key -> the node, not live now, that held it last (of the unserved ones).
    last_held: Mapping[str, str] = field(default_factory=dict)
    damaged: tuple[str, ...] = ()  # why each fleet item that cannot be read is left out

    @property
    def jobs_per_second(self) -> float:
        return sum(n.jobs_per_second for n in self.nodes)

    def counts(self, worker: str | None = None) -> dict[str, int]:
        """Jobs done, retried and failed (morgued) since the live nodes started, from
        their reports (what SQS cannot count): in all, or of one ``worker``."""
        if worker is None:
            return {k: sum(getattr(n, k) for n in self.nodes) for k in COUNTS}
        return {k: sum(n.by_worker.get(worker, {}).get(k, 0) for n in self.nodes) for k in COUNTS}

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

    def excludes(self, since: float = -math.inf) -> list[dict[str, Any]]:
        """``[{"node", "since", "reason"}]``: nodes gone since ``since``, left out of figures."""
        return [
            {"node": g.report.node, "since": g.gone_at, "reason": g.reason}
            for g in self.gone
            if g.gone_at >= since
        ]

    def to_json(self, reshards: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """As ``shardq nodes --json`` prints it and ``/api/v1/nodes`` answers, with the
        ``reshards`` in progress (their JSON) only while there are some."""
        return {
            "time": self.time,
            "nodes": [_node_json(n) for n in self.nodes],
            "gone": [
                _node_json(g.report, gone_at=g.gone_at, reason=g.reason, unserved=list(g.unserved))
                for g in self.gone
            ],
            "unserved": list(self.unserved),
            "no_live_node": self.no_live_node,
            "damaged": list(self.damaged),
            **({"reshards": list(reshards)} if reshards else {}),
        }


@dataclass(frozen=True)
class FleetItems:
    """The fleet's items as read from the store."""

    nodes: tuple[Item, ...] = ()
    owners: tuple[Item, ...] = ()


def read_fleet(store: Store) -> FleetItems:
    """The ownership items, then the heartbeats (two prefix queries), damaged ones too."""
    owners = store.query_all("shard/", keep_damaged=True)
    return FleetItems(tuple(store.query_all("node/", keep_damaged=True)), tuple(owners))


def fleet_view(
    items: FleetItems,
    now: float,
    shards: Mapping[str, int] | None = None,
    prefix: str | None = None,
) -> FleetView:
    """What operators see at ``now``; ``shards`` (generation name -> count of the live
    layout) adds the shards no live node serves; with ``prefix``, the heartbeats of
    another app's fleet (another queue_prefix, sharing the store) are left out."""
    ours = (i for i in items.nodes if prefix is None or prefix_of(i.value) in (None, prefix))
    nodes = [i for i in ours if not i.damaged]
    owned = {i.key.partition("/")[2]: str(i.value.get("owner", "")) for i in items.owners}
    reports = [Heartbeat.from_value(i.key.partition("/")[2], i.value) for i in nodes]
    reports = [  # a report over the size limit without its shards: its ownership items
        replace(r, held=tuple(k for k, o in owned.items() if o == r.node))
        if "held" in r.omitted and r.mode == ELASTIC
        else r
        for r in reports
    ]
    judged = any(  # a live elastic node marks the others gone: trust its marks
        r.mode == ELASTIC and not r.gone and now - r.at <= stale_after(r) for r in reports
    )
    live: list[Heartbeat] = []
    went: list[Heartbeat] = []  # marked gone, or (none judging) not reporting
    for report in reports:
        if not report.gone and not judged and now - report.at > stale_after(report):
            report = replace(report, gone=NOT_REPORTING, gone_at=report.at)
        (went if report.gone else live).append(report)
    by_id = {r.node: r for r in live}
    owners = {k: r.node for r in live if r.mode != ELASTIC for k in r.held}
    owners.update((k, o) for k, o in owned.items() if o in by_id)
    last_held: dict[str, str] = {}
    for report in sorted(went, key=lambda r: r.gone_at):  # the latest to go wins
        last_held.update((k, report.node) for k in report.held if k not in owners)
    # an ownership item still naming a node not live
    last_held.update((k, o) for k, o in owned.items() if o and k not in owners)
    lags = {k: float(by_id[n].lags[k]) for k, n in owners.items() if k in by_id[n].lags}
    gone = [
        GoneView(r, r.gone_at, r.gone, _sorted(k for k in r.held if k not in owners))
        for r in went
        if now - r.gone_at <= GONE_KEPT_SECONDS
    ]
    return FleetView(
        time=now,
        reported=any(not i.damaged for i in (*items.nodes, *items.owners)),
        nodes=tuple(sorted(live, key=lambda r: r.node)),
        gone=tuple(sorted(gone, key=lambda g: (-g.gone_at, g.report.node))),
        owners=owners,
        lags=lags,
        unserved=_sorted(k for k in shard_keys(shards or {}) if k not in owners),
        last_held=last_held,
        damaged=tuple(i.damaged for i in (*items.nodes, *items.owners) if i.damaged),
    )


def _sorted(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(keys), key=key_order))


def _node_json(report: Heartbeat, **extra: Any) -> dict[str, Any]:
    """The report with ``at`` as ``seen``, without its lags, lease time and prefix
    (``concurrency`` and ``slots_in_use`` only when it has them), with ``extra`` fields."""
    left_out = ("at", "lags", "expire", "prefix", "omitted")
    data = {k: v for k, v in report.to_value().items() if k not in left_out}
    data.update(
        seen=report.at,
        shards=len(set(report.held)),
        held=list(_sorted(report.held)),
        by_worker={w: dict(c) for w, c in sorted(report.by_worker.items())},
        max_lag=report.max_lag,
        **extra,
    )
    return {k: v for k, v in data.items() if v is not None}


def nodes_text(view: FleetView, backlog: Mapping[str, int] | None = None) -> str:
    """``shardq nodes``: the live nodes, then the nodes gone in the last hour, as tables."""
    parts = [NO_LIVE_NODE]
    if view.nodes:
        parts[0] = _columns(
            view.nodes,
            ("node", "l", lambda n: n.node),
            ("host", "l", lambda n: n.host),
            ("pid", "l", lambda n: str(n.pid)),
            ("mode", "l", lambda n: n.mode),
            ("started (UTC)", "l", lambda n: utc(n.started)),
            ("last seen", "r", lambda n: f"{age(max(0.0, view.time - n.at))} ago"),
            ("shards", "r", lambda n: str(len(set(n.held)))),
            ("slots", "r", lambda n: slots_text(n.slots_in_use, n.concurrency)),
            ("jobs/s", "r", lambda n: f"{n.jobs_per_second:.1f}"),
            ("done", "r", lambda n: str(n.done)),
            ("retried", "r", lambda n: str(n.retried)),
            ("failed", "r", lambda n: str(n.failed)),
            ("max lag", "r", lambda n: age(n.max_lag)),
        )
    if view.gone:
        gone = _columns(
            view.gone,
            ("node", "l", lambda g: g.report.node),
            ("host", "l", lambda g: g.report.host),
            ("pid", "r", lambda g: str(g.report.pid)),
            ("last seen (UTC)", "l", lambda g: utc(g.report.at)),
            ("gone (UTC)", "l", lambda g: utc(g.gone_at)),
            ("reason", "l", lambda g: g.reason),
            ("shards", "r", lambda g: str(len(set(g.report.held)))),
            ("unserved", "r", lambda g: str(len(g.unserved))),
        )
        parts.append("gone in the last hour:\n" + gone)
    return "\n\n".join(parts + unserved_lines(view, backlog or {}))


def _columns(items: Iterable[Any], *columns: tuple[str, str, Callable[[Any], str]]) -> str:
    """A table of ``items``, one column per (header, ``l``/``r`` alignment, cell)."""
    rows = [tuple(c[0] for c in columns)]
    rows += [tuple(cell(item) for _, _, cell in columns) for item in items]
    return table(rows, align="".join(c[1] for c in columns))


def slots_text(in_use: int | None, concurrency: int | None) -> str:
    """``"12/32"``: execution slots in use out of the node's ``concurrency``."""
    if concurrency is None:
        return "-"
    return f"{'?' if in_use is None else in_use}/{concurrency}"


def unserved_lines(view: FleetView, backlog: Mapping[str, int]) -> list[str]:
    """The shards no live node serves, with the jobs waiting in each (if known)."""
    if not view.unserved:
        return []
    jobs = [f"{k} ({backlog[k]} waiting)" if k in backlog else k for k in view.unserved]
    return [
        f"{plural(len(view.unserved), 'shard')} served by no live node (lag unknown): "
        + ", ".join(jobs)
    ]


def fleet_lines(
    view: FleetView, lag_source: str | None, backlog: Mapping[str, int] | None = None
) -> list[str]:
    """What ``shardq stats`` says about the fleet under its table."""
    if not view.reported:
        lags = "; on SQS lags come from their reports" if lag_source is None else ""
        no_report = f"no node has reported yet: owners unknown{lags} (see `shardq nodes`)"
        return [no_report, *damaged_lines(view)]
    lags = "; lags are their owners' reports, a few seconds old"
    lines = [
        f"{plural(len(view.nodes), 'node')} live, {view.jobs_per_second:.1f} jobs/s together "
        f"(from their reports){lags if lag_source == 'reports' else ''}"
    ]
    if not view.nodes:
        lines = [NO_LIVE_NODE]
    elif lag_source != "broker":  # SQS counts no jobs done: the nodes do
        lines.append(f"  since they started: {_counts_text(view.counts())} (from their reports)")
        lines += [f"    {w}: {_counts_text(view.counts(w))}" for w in view.counted_workers]
    lines += [
        f"  excludes {g.report.node}: {g.reason} since {utc(g.gone_at)} UTC" for g in view.gone
    ]
    return lines + unserved_lines(view, backlog or {}) + damaged_lines(view)


def damaged_lines(view: FleetView) -> list[str]:
    """The fleet items left out because they cannot be read."""
    return [f"left out of the fleet: {why}" for why in view.damaged]


def _counts_text(c: Mapping[str, int]) -> str:
    return f"{c['done']} done, {c['retried']} retried, {c['failed']} failed"
