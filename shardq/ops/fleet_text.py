"""The fleet as ``shardq nodes`` and ``shardq stats`` print it."""

from __future__ import annotations

from collections.abc import Mapping

from shardq.core.tables import age, table, utc
from shardq.core.terminal import plural
from shardq.ops.fleet_view import FleetView

NODES_JSON_HELP = """\
--json prints {"time": T, "nodes": [NODE, ...], "gone": [NODE, ...], "unserved":
["Worker:shard", ...] (shards of the live layout no live node serves), "no_live_node"
(nodes ran before and none is live now)}, plus
"reshards": [RESHARD, ...] while a reshard is in progress (times are Unix seconds;
GET /api/v1/nodes on the dashboard answers the same):
  NODE   {"node", "host", "pid", "mode" ("elastic" or "static"), "version",
          "threads", "concurrency" (execution slots), "slots_in_use" (jobs
          running now), "started", "seen" (its last heartbeat,
          by its own clock), "shards" (how many it
          holds), "held" (["Worker:shard", ...]; a shard of layout generation g > 0
          is "Worker@g:shard"), "jobs_per_second", "done" (jobs since it started),
          "retried", "failed" (jobs moved to the morgue), "by_worker" ({worker:
          {"done", "retried", "failed"}}, since it started), "max_lag" (seconds)}
  RESHARD  a reshard in progress: {"worker", "from", "to" (shards), "from_gen",
          "to_gen", "trust", "phase" ("announced" or "switched"),
          "old_shards_open", "old_shards", "open", "old_jobs" (waiting or in
          flight in the old layout), "by", "unserved" (open old shards no live
          node holds), "last_held" ({"shard": node gone that held it last}),
          "stuck" (why it cannot end, or null)}
  a gone NODE also has "gone_at", "reason" ("lease expired": its heartbeat stood
  still for the lease on another node's clock; "not reporting": no live node is
  left to judge and its last heartbeat is old) and "unserved" (shards it held that
  no live node serves yet).
Nodes write a heartbeat (their report) every lease_seconds/5 to the state store; a
node that stops gracefully deletes it and is not listed. Gone nodes are shown an hour.
"""


def nodes_text(view: FleetView, backlog: Mapping[str, int] | None = None) -> str:
    """The live nodes, then the nodes gone in the last hour, as tables."""
    now = view.time
    parts = []
    rows: list[tuple[str, ...]]
    if view.nodes:
        rows = [
            (
                "node",
                "host",
                "pid",
                "mode",
                "started (UTC)",
                "last seen",
                "shards",
                "slots",
                "jobs/s",
                "done",
                "retried",
                "failed",
                "max lag",
            )
        ]
        for n in view.nodes:
            rows.append(
                (
                    n.node,
                    n.host,
                    str(n.pid),
                    n.mode,
                    utc(n.started),
                    f"{age(max(0.0, now - n.seen))} ago",
                    str(len(set(n.held))),
                    slots_text(n.slots_in_use, n.concurrency),
                    f"{n.jobs_per_second:.1f}",
                    str(n.done),
                    str(n.retried),
                    str(n.failed),
                    age(n.max_lag),
                )
            )
        parts.append(table(rows, align="lllllrrrrrrrr"))
    else:
        parts.append("no live node at all: no shard is served")
    if view.gone:
        rows = [
            ("node", "host", "pid", "last seen (UTC)", "gone (UTC)", "reason", "shards", "unserved")
        ]
        for g in view.gone:
            rows.append(
                (
                    g.report.node,
                    g.report.host,
                    str(g.report.pid),
                    utc(g.report.seen),
                    utc(g.gone_at),
                    g.reason,
                    str(len(set(g.report.held))),
                    str(len(g.unserved)),
                )
            )
        parts.append("gone in the last hour:\n" + table(rows, align="llrlllrr"))
    if view.unserved:
        parts.append("\n".join(unserved_lines(view, backlog or {})))
    return "\n\n".join(parts)


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
        return [f"no node has reported yet: owners unknown{lags} (see `shardq nodes`)"]
    lags = "; lags are their owners' reports, a few seconds old"
    lines = [
        f"{plural(len(view.nodes), 'node')} live, {view.jobs_per_second:.1f} jobs/s together "
        f"(from their reports){lags if lag_source == 'reports' else ''}"
    ]
    if view.nodes and lag_source != "broker":  # SQS counts no jobs done: the nodes do
        c = view.counts()
        lines.append(
            f"  since they started: {c['done']} done, {c['retried']} retried, "
            f"{c['failed']} failed (from their reports)"
        )
        for worker in view.counted_workers:
            c = view.counts(worker)
            lines.append(
                f"    {worker}: {c['done']} done, {c['retried']} retried, {c['failed']} failed"
            )
    if not view.nodes:
        lines = ["no live node at all: no shard is served"]
    lines += [
        f"  excludes {g.report.node}: {g.reason} since {utc(g.gone_at)} UTC" for g in view.gone
    ]
    return lines + unserved_lines(view, backlog or {})
