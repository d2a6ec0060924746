"""Operations commands: ``stats``, ``nodes``, ``morgue``, ``publish``, ``queues ensure``,
``dashboard``.

Each works the same on the embedded broker and on SQS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from shardq.api.app import App
from shardq.core.envelope import refuse_constant
from shardq.core.errors import ConfigError
from shardq.core.tables import age, optional, table
from shardq.core.terminal import plural
from shardq.ops import bulk
from shardq.ops.admin_morgue import add_morgue
from shardq.ops.ensure import PRUNE_HELP, ensure
from shardq.ops.fleet_text import NODES_JSON_HELP, fleet_lines, nodes_text
from shardq.ops.fleet_view import fleet_view
from shardq.ops.layout_text import layout_lines
from shardq.ops.layout_view import reshards
from shardq.ops.stats import (
    backlog,
    collect,
    live_shards,
    no_queues_text,
    queues_exist,
    read_fleet,
    stats_backlog,
)

EXIT_OK, EXIT_USAGE = 0, 2
NO_REPORT = (
    "no node has reported yet: nodes write their heartbeat to the state store when they "
    "start. "
    "Start one with `shardq run` (it joins the fleet) or `shardq run --node N --nodes M`, "
    "with the same broker and queue prefix as this command"
)

Loader = Callable[[argparse.Namespace], App]
RAW = argparse.RawDescriptionHelpFormatter


def add_commands(
    commands: Any, common: Callable[[argparse.ArgumentParser], None], load: Loader
) -> None:
    """Register the operations subcommands on the ``shardq`` parser."""

    def command(name: str, help: str, examples: str, handler: Callable[..., int]) -> Any:
        p = commands.add_parser(
            name, help=help, description=help, formatter_class=RAW, epilog="examples:\n" + examples
        )
        common(p)
        p.set_defaults(handler=lambda args: handler(load(args), args))
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

    add_morgue(commands, common, load)

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
    ensure_cmd = qa.add_parser(
        "ensure",
        formatter_class=RAW,
        help="create missing queues and the state table; report settings that drifted",
        description="Create every shard queue of the live layouts (after a reshard, not "
        "what the code's shards say) and every morgue queue that is missing, each keeping "
        "messages 14 days (the SQS maximum), and, for sqs://, the DynamoDB state table "
        "(waiting until it is ACTIVE); check the existing queues: FIFO, no content-based "
        "dedup, the worker's visibility timeout, the 14-day retention. "
        "Exit 4 if any queue drifted.",
        epilog="examples:\n  SHARDQ_BROKER_URL=sqs:// shardq queues ensure\n"
        "  shardq queues ensure --prune   # also delete empty retired queues\n",
    )
    common(ensure_cmd)
    ensure_cmd.add_argument("--prune", action="store_true", help=PRUNE_HELP)
    ensure_cmd.set_defaults(handler=lambda args: _ensure(load(args), args))

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
    dash.add_argument("--refresh", type=float, default=5.0, help="seconds between samples (5)")
    dash.add_argument("--log-format", choices=("auto", "console", "json"))
    dash.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    dash.add_argument(
        "--scrape",
        action="append",
        default=[],
        metavar="URL",
        help="a node's Prometheus metrics URL, for throughput on SQS (repeatable)",
    )


# -- handlers ---------------------------------------------------------------------
def _stats(app: App, args: argparse.Namespace) -> int:
    stats = collect(app)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    if stats.no_queues:  # all zeros would read as "nothing waiting"
        print(f"shardq: {stats.no_queues}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        return EXIT_OK
    rows = [("worker", "length", "in flight", "morgue", "lag", "done", "owner")]
    for w in stats.workers:
        rows.append(
            (
                w.name,
                str(w.length),
                str(w.in_flight),
                str(w.morgue_length),
                lag_cell(w.lag, w.unknown_lags),
                optional(w.done),
                "",
            )
        )
        for s in w.shards:
            rows.append(
                (
                    f"  [{s.shard}]" if s.gen == 0 else f"  [@{s.gen}:{s.shard}]",
                    str(s.length),
                    str(s.in_flight),
                    "",
                    lag_cell(s.lag, int(s.lag is None and s.length > 0)),
                    optional(s.done),
                    s.owner or "-",
                )
            )
    total = stats.to_dict()["total"]
    rows.append(
        (
            "total",
            str(total["length"]),
            str(total["in_flight"]),
            str(total["morgue_length"]),
            lag_cell(total["lag"], sum(w.unknown_lags for w in stats.workers)),
            optional(total["done"]),
            "",
        )
    )
    print(table(rows, align="lrrrrrl"))
    fleet = fleet_lines(stats.fleet, stats.lag_source, stats_backlog(stats))
    for line in [*layout_lines(stats), *fleet]:
        print(line, file=sys.stderr)
    if stats.fleet_error:
        print(f"cannot read the fleet from the state store: {stats.fleet_error}", file=sys.stderr)
    return EXIT_OK


def lag_cell(lag: float | None, unknown: int) -> str:
    """A lag as ``shardq stats`` prints it: ``>=42.0 s`` when ``unknown`` shards with
    jobs are left out of it (a lower bound), ``unknown`` when nothing else is known."""
    if not unknown:
        return age(lag)
    return "unknown" if lag is None else f">={age(lag)}"


def _nodes(app: App, args: argparse.Namespace) -> int:
    now = time.time()
    view = fleet_view(read_fleet(app), now, live_shards(app))
    moves = reshards(app, view if view.reported else None)
    if not view.reported and not queues_exist(app):  # most likely a queue_prefix typo
        print(f"shardq: {no_queues_text(app)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        reshards_json = {"reshards": [m.to_json() for m in moves]} if moves else {}
        print(json.dumps({**view.to_json(), **reshards_json}, indent=2))
    else:
        if view.reported:
            print(nodes_text(view, backlog(app, view.unserved)))
        if moves:
            print(("\n" if view.reported else "") + "\n".join(m.text() for m in moves))
    if not view.reported:
        print(NO_REPORT, file=sys.stderr)
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
        if args.file == "-":
            lines = bulk.read_jobs(app, worker, sys.stdin, source)
        else:
            with open(args.file, encoding="utf-8") as stream:
                lines = bulk.read_jobs(app, worker, stream, source)
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


def _ensure(app: App, args: argparse.Namespace) -> int:
    return ensure(app, with_prune=args.prune)


def _dashboard(app: App, args: argparse.Namespace) -> int:
    from shardq.ops import logs
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
        return json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise ConfigError(
            f"{name} is JSON nested too deeply to read; flatten it, or store the data "
            "elsewhere and publish a reference"
        ) from None
    except ValueError as exc:
        raise ConfigError(
            f"{name} is not valid JSON ({exc}); quote it, e.g. '{{\"a\": 1}}'"
        ) from None
