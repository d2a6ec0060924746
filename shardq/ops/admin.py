"""The operations commands (``stats``, ``nodes``, ``morgue``, ``publish``, ``queues
ensure``, ``dashboard``, ``reshard``), the same on the embedded broker and on SQS."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from shardq.api.app import App
from shardq.core.envelope import NestedTooDeeply, parse_json
from shardq.core.errors import ConfigError
from shardq.core.exits import EXIT_OK, EXIT_USAGE
from shardq.core.jobs import MAX_SHARDS
from shardq.core.tables import age, optional, table
from shardq.core.terminal import plural
from shardq.ops import bulk, logs
from shardq.ops.admin_morgue import add_morgue
from shardq.ops.ensure import PRUNE_HELP, ensure
from shardq.ops.fleet_view import damaged_lines, fleet_lines, nodes_text
from shardq.ops.layout_view import layout_lines, reshards
from shardq.ops.reshard import EXAMPLES as RESHARD_EXAMPLES
from shardq.ops.reshard import reshard_command
from shardq.ops.stats import (
    Stats,
    backlog,
    collect,
    current_fleet,
    no_queues_text,
    queues_exist,
    stats_backlog,
)

NO_REPORT = (
    "no node has reported yet: nodes write their heartbeat to the state store when they "
    "start. "
    "Start one with `shardq run` (it joins the fleet) or `shardq run --node N --nodes M`, "
    "with the same broker and queue prefix as this command"
)

Loader = Callable[[argparse.Namespace], App]
RAW = argparse.RawDescriptionHelpFormatter
NODES_JSON_HELP = """\
--json prints {"time": T, "nodes": [NODE, ...], "gone": [NODE, ...], "unserved":
["Worker:shard", ...] (shards of the live layout no live node serves), "no_live_node"
(nodes ran before and none is live now), "damaged" (why each fleet item that cannot be
read is left out)}, plus
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


def subcommand(
    parent: Any, name: str, help: str, examples: str, handler: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A ``shardq`` subcommand: its help (its description too), examples and handler."""
    p: argparse.ArgumentParser = parent.add_parser(
        name, help=help, description=help, formatter_class=RAW, epilog="examples:\n" + examples
    )
    p.set_defaults(handler=handler)
    return p


def add_commands(
    commands: Any, common: Callable[[argparse.ArgumentParser], None], load: Loader
) -> None:
    """Register the operations subcommands on the ``shardq`` parser."""

    def command(
        name: str, help: str, examples: str, handler: Callable[..., int], parent: Any = commands
    ) -> argparse.ArgumentParser:
        """A subcommand with the common options, running ``handler(app, args)``."""
        p = subcommand(parent, name, help, examples, lambda args: handler(load(args), args))
        common(p)
        return p

    stats = command(
        "stats",
        "queue lengths, jobs in flight, morgue sizes and lag per worker",
        "  shardq stats\n  shardq stats --json | jq .total\n",
        _stats,
    )
    stats.add_argument("--json", action="store_true", help="print the JSON of /api/v1/stats")

    nodes = command(
        "nodes",
        "the live nodes of the fleet, and the nodes gone in the last hour",
        "  shardq nodes\n  shardq nodes --json | jq '.nodes[].node'\n\n" + NODES_JSON_HELP,
        _nodes,
    )
    nodes.add_argument("--json", action="store_true", help="print the JSON of /api/v1/nodes")

    add_morgue(commands, command)

    publish = command(
        "publish",
        "publish one job, or many from JSON lines",
        '  shardq publish SyncOrder order-42 \'{"status": "paid"}\'\n'
        '  echo \'{"status": "paid"}\' | shardq publish SyncOrder order-42 -\n'
        "  shardq publish SyncOrder --file jobs.jsonl   # one job per line:\n"
        '    {"entity": "order-42", "payload": {"status": "paid"}, "dedup_id": "evt-981"}\n',
        _publish,
    )
    publish.add_argument("worker", metavar="WORKER")
    publish.add_argument("entity", metavar="ENTITY", nargs="?")
    publish.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="JSON, or - to read stdin"
    )
    publish.add_argument(
        "--file",
        metavar="PATH",
        help="publish one job per line of this file (- for stdin): a JSON object with "
        "entity, payload and optional dedup_id and meta",
    )
    publish.add_argument("--dedup-id", help="idempotency key (5 minutes, per entity)")
    publish.add_argument("--meta", metavar="JSON", help="metadata object (trace ids, ...)")

    queues = commands.add_parser("queues", help="create or check the queues")
    qa = queues.add_subparsers(dest="action", metavar="ACTION", required=True)
    ensure_cmd = command(
        "ensure",
        "create missing queues and the state table; report settings that drifted",
        "  SHARDQ_BROKER_URL=sqs:// shardq queues ensure\n"
        "  shardq queues ensure --prune   # also delete empty retired queues\n",
        lambda app, args: ensure(app, with_prune=args.prune),
        qa,
    )
    ensure_cmd.description = (
        "Create every shard queue of the live layouts (after a reshard, not "
        "what the code's shards say) and every morgue queue that is missing, each keeping "
        "messages 14 days (the SQS maximum), and, for sqs://, the DynamoDB state table "
        "(waiting until it is ACTIVE); check the existing queues: FIFO, no content-based "
        "dedup, the worker's visibility timeout, the 14-day retention. "
        "Exit 4 if any queue drifted."
    )
    ensure_cmd.add_argument("--prune", action="store_true", help=PRUNE_HELP)

    dash = command(
        "dashboard",
        "serve the web dashboard and JSON API",
        "  shardq dashboard                      # http://127.0.0.1:8642\n"
        "  SHARDQ_DASHBOARD_TOKEN=s3cret shardq dashboard --host 0.0.0.0\n"
        "  shardq dashboard --scrape http://node-1:9100/metrics  # throughput on SQS\n",
        _dashboard,
    )
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    dash.add_argument("--port", type=int, default=8642, help="port (8642)")
    dash.add_argument(
        "--refresh", type=float, default=5.0, help="seconds between samples (5; 0.1 to 3600)"
    )
    log_options(dash)
    dash.add_argument(
        "--scrape",
        action="append",
        default=[],
        metavar="URL",
        help="a node's Prometheus metrics URL, for throughput on SQS (repeatable)",
    )
    reshard = command(
        "reshard",
        "change a live worker's number of shards, keeping each entity's order",
        RESHARD_EXAMPLES,
        reshard_command,
    )
    reshard.description = "Change a live worker's number of shards while publishers and nodes run."
    reshard.add_argument("worker", help="the worker class name")
    reshard.add_argument(
        "--shards", type=int, required=True, help=f"the new number (1..{MAX_SHARDS})"
    )
    reshard.add_argument("--no-wait", action="store_true", help="return once the reshard has begun")


def log_options(p: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level`` (``shardq run`` and ``shardq dashboard``)."""
    p.add_argument("--log-format", choices=("auto", "console", "json"))
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))


# -- handlers ---------------------------------------------------------------------
def _stats(app: App, args: argparse.Namespace) -> int:
    stats = collect(app)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    if stats.no_queues:  # all zeros would read as "nothing waiting"
        print(f"shardq: {stats.no_queues}", file=sys.stderr)
        return EXIT_USAGE
    unread = {"fleet": stats.fleet_error, "morgue sizes": stats.morgue_error}
    unread_lines = [
        f"cannot read the {k} from the state store: {v}" for k, v in unread.items() if v
    ]
    if args.json:
        for line in [*damaged_lines(stats.fleet), *unread_lines]:
            print(line, file=sys.stderr)
        return EXIT_OK
    print(_stats_table(stats))
    views = [w.layout for w in stats.workers if w.layout is not None]
    fleet = fleet_lines(stats.fleet, stats.lag_source, stats_backlog(stats))
    for line in [*layout_lines(views, stats.layout_error), *fleet, *unread_lines]:
        print(line, file=sys.stderr)
    return EXIT_OK


def _stats_table(stats: Stats) -> str:
    """A row per worker, then one per shard of it; the total last."""
    rows = [("worker", "length", "in flight", "morgue", "lag", "done", "owner")]

    def add(name: str, c: dict[str, Any], unknown: int, owner: str = "") -> None:
        dead = optional(c["morgue_length"]) if "morgue_length" in c else ""  # None: unread
        dead += "+" if c.get("morgue_more") else ""
        counts = (str(c["length"]), str(c["in_flight"]), dead)
        rows.append((name, *counts, lag_cell(c["lag"], unknown), optional(c["done"]), owner))

    for w in stats.workers:
        add(w.name, vars(w), w.unknown_lags)
        for s in w.shards:
            name = f"  [{s.shard}]" if s.gen == 0 else f"  [@{s.gen}:{s.shard}]"
            add(name, vars(s), int(s.lag_unknown), s.owner or "-")
    add("total", stats.to_dict()["total"], sum(w.unknown_lags for w in stats.workers))
    return table(rows, align="lrrrrrl")


def lag_cell(lag: float | None, unknown: int) -> str:
    """A lag as ``shardq stats`` prints it: ``>=42.0 s`` when ``unknown`` shards with
    jobs are left out of it (a lower bound), ``unknown`` when nothing else is known."""
    if not unknown:
        return age(lag)
    return "unknown" if lag is None else f">={age(lag)}"


def _nodes(app: App, args: argparse.Namespace) -> int:
    view = current_fleet(app, time.time())
    moves = reshards(app, view if view.reported else None)
    if not view.reported and not queues_exist(app):  # most likely a queue_prefix typo
        print(f"shardq: {no_queues_text(app)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(view.to_json([m.to_json() for m in moves]), indent=2))
    else:
        if view.reported:
            print(nodes_text(view, backlog(app, view.unserved)))
        if moves:
            print(("\n" if view.reported else "") + "\n".join(m.text() for m in moves))
    if not view.reported:
        print(NO_REPORT, file=sys.stderr)
    for line in damaged_lines(view):
        print(line, file=sys.stderr)
    return EXIT_OK


def _publish(app: App, args: argparse.Namespace) -> int:
    if args.file is not None:
        return _publish_file(app, args)
    if args.entity is None or args.payload is None:
        raise ConfigError("publish takes WORKER ENTITY PAYLOAD_JSON, or WORKER --file PATH")
    worker = app.worker(args.worker)
    text = sys.stdin.read() if args.payload == "-" else args.payload
    payload = _json_arg("PAYLOAD_JSON", text)
    meta = _json_arg("--meta", args.meta) if args.meta else None
    if meta is not None and not isinstance(meta, dict):
        raise ConfigError("--meta must be a JSON object")
    print(worker.publish(args.entity, payload, dedup_id=args.dedup_id, meta=meta))
    return EXIT_OK


def _publish_file(app: App, args: argparse.Namespace) -> int:
    if args.entity is not None or args.dedup_id is not None or args.meta is not None:
        raise ConfigError(
            "publish --file takes each job's entity, payload, dedup_id and meta from its "
            "line: drop ENTITY, PAYLOAD_JSON, --dedup-id and --meta"
        )
    worker = app.worker(args.worker).__name__
    source = "stdin" if args.file == "-" else args.file
    try:
        with nullcontext(sys.stdin) if args.file == "-" else open(args.file, encoding="utf-8") as f:
            lines = bulk.read_jobs(app, worker, f, source)
    except OSError as exc:
        raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source} is not UTF-8 text ({exc.reason})") from None
    except KeyboardInterrupt:
        raise bulk.PublishInterrupted(
            f"interrupted while checking {source}: nothing was published", []
        ) from None
    n = bulk.publish_lines(app, worker, lines)
    print(f"published {plural(n, f'{worker} job')} from {source}", file=sys.stderr)
    return EXIT_OK


def _dashboard(app: App, args: argparse.Namespace) -> int:
    from shardq.ops.dashboard import serve

    logs.configure(app.config.log_format, app.config.log_level)
    serve(
        app,
        host=args.host,
        port=args.port,
        token=app.config.dashboard_token,
        refresh=args.refresh,
        scrape=args.scrape,
    )
    return EXIT_OK


# -- helpers ----------------------------------------------------------------------
def _json_arg(name: str, text: str) -> Any:
    try:
        return parse_json(text)
    except NestedTooDeeply:
        raise ConfigError(
            f"{name} is JSON nested too deeply to read; flatten it, or store the data "
            "elsewhere and publish a reference"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{name} is {exc}; quote it, e.g. '{{\"a\": 1}}'") from None
