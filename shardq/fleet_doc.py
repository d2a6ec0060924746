"""The fleet document: what each node of an app last reported, and who should hold
each shard.

It is one JSON document, the only message of the app's fleet state queue (see
:mod:`shardq.fleet_store`). Each node rewrites its own entry about every
``report_seconds``; nodes that stop are moved to ``gone`` (kept an hour). In an
elastic fleet, the writer also recomputes ``targets`` (:func:`shardq.assign.assign`):
the node that should hold each shard.

Readers are other nodes, ``shardq nodes``, ``shardq stats`` and the dashboard. A
document written by a newer shardq (a higher ``format``) is refused with a clear
error; fields a reader does not know are ignored, so a fleet can be upgraded one
node at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from shardq.errors import FleetError

#: The document format this shardq writes and reads.
FORMAT = 1
#: A gone node is listed this long after it went.
GONE_KEPT_SECONDS = 3600.0

ELASTIC, STATIC = "elastic", "static"
#: A node whose last report is older than this (or than its own ``every`` plus
#: :data:`STALE_MARGIN_SECONDS`) is taken as not reporting.
STALE_SECONDS = 60.0
STALE_MARGIN_SECONDS = 15.0


@dataclass(frozen=True)
class NodeReport:
    """One node's last report. Times are Unix seconds; ``held`` and ``lags`` use shard
    keys ``"worker:shard"``."""

    node: str
    host: str
    pid: int
    started: float
    seen: float
    mode: str = ELASTIC
    threads: int = 0
    held: tuple[str, ...] = ()
    lags: Mapping[str, float] = field(default_factory=dict)
    jobs_per_second: float = 0.0
    done: int = 0
    max_lag: float = 0.0
    version: str = ""
    #: Seconds until this node's next report at the latest (0: an older node's report,
    #: taken as every 45 s).
    every: float = 0.0

    @property
    def stale_after(self) -> float:
        """Seconds after ``seen`` from which the node is taken as not reporting."""
        return max(STALE_SECONDS, self.every + STALE_MARGIN_SECONDS)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["held"] = list(self.held)
        data["lags"] = dict(self.lags)
        return data

    @classmethod
    def from_json(cls, data: Any) -> NodeReport:
        obj = _object(data, "a node report")
        return cls(
            node=_text(obj, "node"),
            host=_text(obj, "host"),
            pid=_int(obj, "pid"),
            started=_number(obj, "started"),
            seen=_number(obj, "seen"),
            mode=_text(obj, "mode", ELASTIC),
            threads=_int(obj, "threads", 0),
            held=tuple(_texts(obj, "held")),
            lags={k: float(v) for k, v in _numbers(obj, "lags").items()},
            jobs_per_second=_number(obj, "jobs_per_second", 0.0),
            done=_int(obj, "done", 0),
            max_lag=_number(obj, "max_lag", 0.0),
            version=_text(obj, "version", ""),
            every=_number(obj, "every", 0.0),
        )


@dataclass(frozen=True)
class GoneNode:
    """A node that stopped (``reason``: ``stopped``, ``lease expired``, ``not reporting``)."""

    report: NodeReport
    gone_at: float
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"report": self.report.to_json(), "gone_at": self.gone_at, "reason": self.reason}

    @classmethod
    def from_json(cls, data: Any) -> GoneNode:
        obj = _object(data, "a gone node")
        return cls(
            NodeReport.from_json(obj.get("report")),
            _number(obj, "gone_at"),
            _text(obj, "reason"),
        )


@dataclass(frozen=True)
class FleetDoc:
    """The whole document. ``version`` grows by one with every write."""

    version: int = 0
    written: float = 0.0
    nodes: Mapping[str, NodeReport] = field(default_factory=dict)
    gone: Mapping[str, GoneNode] = field(default_factory=dict)
    #: Shard key -> the node that should hold it (elastic nodes only).
    targets: Mapping[str, str] = field(default_factory=dict)
    #: Shard keys whose lease message exists in the leases queue.
    leases: tuple[str, ...] = ()
    #: Raised by ``shardq reshard``: nodes read the layout document again when it
    #: changes (else rarely), so an idle node does not poll the layout.
    layout: int = 0

    def with_node(self, report: NodeReport) -> FleetDoc:
        nodes = dict(self.nodes)
        nodes[report.node] = report
        gone = {k: v for k, v in self.gone.items() if k != report.node}
        return replace(self, nodes=nodes, gone=gone)

    def without_node(self, node: str, reason: str, now: float) -> FleetDoc:
        """``node`` moved to ``gone`` (if it was listed)."""
        if node not in self.nodes:
            return self
        nodes = dict(self.nodes)
        report = nodes.pop(node)
        gone = dict(self.gone)
        gone[node] = GoneNode(report, now, reason)
        return replace(self, nodes=nodes, gone=gone)

    def pruned(self, now: float) -> FleetDoc:
        """Gone nodes older than :data:`GONE_KEPT_SECONDS` dropped."""
        gone = {k: g for k, g in self.gone.items() if now - g.gone_at <= GONE_KEPT_SECONDS}
        return replace(self, gone=gone) if len(gone) != len(self.gone) else self

    def owners(self) -> dict[str, str]:
        """Shard key -> the node reporting that it holds it (the latest report wins)."""
        result: dict[str, str] = {}
        for report in sorted(self.nodes.values(), key=lambda r: r.seen):
            for key in report.held:
                result[key] = report.node
        return result

    def to_text(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": self.version,
                "written": self.written,
                "nodes": {k: v.to_json() for k, v in sorted(self.nodes.items())},
                "gone": {k: v.to_json() for k, v in sorted(self.gone.items())},
                "targets": dict(sorted(self.targets.items())),
                "leases": sorted(self.leases),
                "layout": self.layout,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_text(cls, text: str) -> FleetDoc:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise FleetError(f"the fleet document is not JSON ({exc})") from exc
        obj = _object(data, "the fleet document")
        fmt = obj.get("format")
        if not isinstance(fmt, int) or isinstance(fmt, bool):
            raise FleetError("the fleet document has no format number")
        if fmt > FORMAT:
            raise FleetError(
                f"the fleet document has format {fmt}, newer than this shardq's {FORMAT}: "
                "upgrade shardq on this machine"
            )
        nodes = _object(obj.get("nodes", {}), "'nodes'")
        gone = _object(obj.get("gone", {}), "'gone'")
        targets = _object(obj.get("targets", {}), "'targets'")
        return cls(
            version=_int(obj, "version"),
            written=_number(obj, "written", 0.0),
            nodes={k: NodeReport.from_json(v) for k, v in nodes.items()},
            gone={k: GoneNode.from_json(v) for k, v in gone.items()},
            targets={k: _as_text(v, "a target") for k, v in targets.items()},
            leases=tuple(_texts(obj, "leases")),
            layout=_int(obj, "layout") if "layout" in obj else 0,
        )


# -- strict field readers: a wrong type is an error that names the field --------------


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FleetError(f"{what} in the fleet document is not an object")
    return value


def _as_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise FleetError(f"{what} in the fleet document is not a string")
    return value


_MISSING: Any = object()


def _get(obj: dict[str, Any], key: str, default: Any) -> Any:
    if key in obj:
        return obj[key]
    if default is _MISSING:
        raise FleetError(f"the fleet document lacks {key!r}")
    return default


def _text(obj: dict[str, Any], key: str, default: Any = _MISSING) -> str:
    return _as_text(_get(obj, key, default), repr(key))


def _int(obj: dict[str, Any], key: str, default: Any = _MISSING) -> int:
    value = _get(obj, key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FleetError(f"{key!r} in the fleet document is not an integer")
    return value


def _number(obj: dict[str, Any], key: str, default: Any = _MISSING) -> float:
    value = _get(obj, key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FleetError(f"{key!r} in the fleet document is not a number")
    return float(value)


def _texts(obj: dict[str, Any], key: str) -> list[str]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FleetError(f"{key!r} in the fleet document is not a list of strings")
    return value


def _numbers(obj: dict[str, Any], key: str) -> dict[str, float]:
    value = _object(obj.get(key, {}), repr(key))
    for v in value.values():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise FleetError(f"{key!r} in the fleet document holds a value that is not a number")
    return value
