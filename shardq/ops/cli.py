"""The ``shardq`` command (its exit codes: :mod:`shardq.core.exits`)."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import structlog

from shardq.api.app import App
from shardq.core.config import Config
from shardq.core.errors import BrokerError, ConfigError, ShardqError
from shardq.core.exits import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from shardq.core.fleet_rules import ELASTIC, STATIC
from shardq.core.plan import Plan, format_plan
from shardq.core.signals import StopSignals
from shardq.core.tables import table
from shardq.core.terminal import plural
from shardq.core.version import VERSION
from shardq.ops import logs
from shardq.ops.admin import add_commands, log_options, subcommand
from shardq.ops.bulk import PublishInterrupted, PublishTerminated
from shardq.store import DamagedItem, StoreError

_EXAMPLES_RUN = """\
  shardq run                                     # join the app's elastic fleet
  shardq run --until-empty                       # process what is queued, then exit
  shardq run --node 0 --nodes 3 --threads 8      # node 0 of a static 3-node plan
  SHARDQ_BROKER_URL=sqs:// shardq run --node 1 --nodes 2

Without --node the node joins the fleet: it takes its fair share of the shards
(ownership items in the state store), hands them back when it stops, and takes over
those of nodes that die (within lease_seconds, default 30). With --node N --nodes M
it serves the static plan of `shardq plan`.
"""
_EXAMPLES_PLAN = """\
  shardq plan --nodes 3 --threads 4              # every node's shards, per thread
  shardq plan --node 1 --nodes 3                 # node 1 only
"""


#: What the command says, and its exit code, when it stops on each kind of error (the
#: first that matches).
_FAILURES: tuple[tuple[type[BaseException], str, int], ...] = (
    (PublishTerminated, "{}", EXIT_TERMINATED),
    (PublishInterrupted, "{}", EXIT_INTERRUPTED),
    (KeyboardInterrupt, "interrupted", EXIT_INTERRUPTED),
    (BrokerError, "broker error: {}", EXIT_ERROR),
    (StoreError, "state store error: {}", EXIT_ERROR),  # unreachable (a conflict is no error)
    (DamagedItem, "state store error: {}", EXIT_ERROR),
    (ShardqError, "error: {}", EXIT_USAGE),
)


def main(argv: Sequence[str] | None = None, *, early: StopSignals | None = None) -> int:
    """The command line. ``early``: the signal handlers ``shardq run`` installed before
    its imports (:func:`shardq.__main__.entry`); made here when it is called directly."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error: return, don't exit
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    args.early = early
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # `shardq stats --json | head`: the reader left
        _silence_stdout()
        return EXIT_PIPE
    except (KeyboardInterrupt, ShardqError) as exc:
        text, code = next((t, c) for kind, t, c in _FAILURES if isinstance(exc, kind))
        print("shardq: " + text.format(exc), file=sys.stderr)
        return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class _Parser(argparse.ArgumentParser):
    """Flags spelled out: ``--al --ye`` is refused, not taken as ``--all --yes``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "allow_abbrev": False})


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardq", description="Ordered, per-entity, sharded jobs on SQS FIFO.")
    parser.add_argument("--version", action="version", version=f"shardq {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = subcommand(commands, "run", "run a node", _EXAMPLES_RUN, _run)
    run.description = "Run a node: serve its share of all shards until SIGTERM/SIGINT/SIGHUP."
    _common(run)
    _placement(run, nodes_default=None)
    run.add_argument(
        "--concurrency", type=int, help="most jobs the node runs at once (default from config: 32)"
    )
    run.add_argument(
        "--until-empty",
        action="store_true",
        help="stop (exit 0) once every shard of the node is empty",
    )
    run.add_argument("--grace-seconds", type=float, help="time running jobs get at shutdown")
    log_options(run)
    run.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    run.add_argument("--metrics-host", help="address of /metrics (default 127.0.0.1)")
    run.add_argument("--seed", type=int, help="seed the schedulers' lottery (reproducible runs)")

    plan = subcommand(
        commands, "plan", "print which node and thread own each shard", _EXAMPLES_PLAN, _plan
    )
    _common(plan)
    _placement(plan)
    add_commands(commands, _common, lambda args: one_shot(load(args)[0]))
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="config file (default: ./shardq.yaml if any)")
    p.add_argument(
        "--app",
        metavar="MODULE[:ATTR]",
        help="module defining the app and workers (default: workers)",
    )
    p.add_argument("--broker-url", help="sqlite:///shardq.db (default), memory:// or sqs://")
    p.add_argument("--queue-prefix", help="prefix of every queue name")


def _placement(p: argparse.ArgumentParser, nodes_default: int | None = 1) -> None:
    p.add_argument("--node", type=int, help="this node's number, from 0")
    p.add_argument(
        "--nodes", type=int, default=nodes_default, help="number of nodes of a static plan"
    )
    p.add_argument("--threads", type=int, help="threads per node (default from config: 4)")


def load(args: argparse.Namespace) -> tuple[App, Config]:
    """The config (file < env < flags) and the app it names, configured with it."""
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}  # flags win
    config = Config.load(args.config, overrides=overrides)
    app = load_app(config.app)
    if app.base_config is not None:
        config = Config.load(args.config, overrides=overrides, base=app.base_config)
    app.configure(config)
    app.check()
    if not app.workers and getattr(args, "command", None) != "morgue":  # removed ones' dead jobs
        raise ConfigError("no workers are registered; check --app (default: the workers module)")
    return app, config


def one_shot(app: App) -> App:
    """For every command but ``run``: once an SQS or DynamoDB endpoint let a whole call time
    out, the command's later calls to it fail at once (``Unanswered``), so a hung
    endpoint fails the command within one call's bound, not one per call."""
    unanswered = getattr(app.broker, "unanswered", None)  # SQS only
    if unanswered is not None:
        unanswered.fail_fast()
    return app


def load_app(spec: str) -> App:
    """Import ``module[:attr]`` (the working directory first on the path) and find its App."""
    module_name, _, attr = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name):
        raise ConfigError(
            f"app {spec!r} is not MODULE[:ATTR] (a module's dotted name, e.g. workers or "
            "myapp.jobs:app); check --app or SHARDQ_APP"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # its own error, a missing dependency, a syntax error
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and f"{module_name}.".startswith(f"{missing}."):  # not one it imports
            raise ConfigError(
                f"app module {module_name!r} not found; run from the directory that holds it "
                "or pass --app package.module"
            ) from exc
        raise ConfigError(_import_failed(module_name, exc)) from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, App):
            raise ConfigError(f"{module_name}.{attr} is not a shardq.App")
        return found
    apps = {id(v): v for v in vars(module).values() if isinstance(v, App)}
    if len(apps) != 1:
        raise ConfigError(
            f"module {module_name} defines {len(apps)} shardq.App objects; "
            f"name one with --app {module_name}:ATTR"
        )
    return next(iter(apps.values()))


def _import_failed(module: str, exc: Exception) -> str:
    """Why the app module could not be imported, and where (the deepest line of it)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename[:1] != "<"]
    where = ""  # a SyntaxError names its file and line itself
    if frames and not isinstance(exc, SyntaxError):
        where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
    return (
        f"app module {module!r} failed to import: {type(exc).__name__}: {exc}{where}; "
        f"`python -c 'import {module}'` shows the whole traceback"
    )


def _run(args: argparse.Namespace) -> int:
    early = args.early  # a SIGTERM while the node starts up stops it cleanly
    if early is None:
        early = StopSignals(threading.Event())
        early.install()
    app, config = load(args)
    logs.configure(config.log_format, config.log_level)
    if args.node is None and args.nodes is not None:
        raise ConfigError("--nodes needs --node (a static plan); leave both out to join the fleet")
    if args.node is None:
        shards = sum(app.settings(w).shards for w in app.workers)
        _warn_idle_threads(config.threads, shards)
        node = app.node(
            Plan(0, 0, ()),
            until_empty=args.until_empty,
            seed=args.seed,
            threads=config.threads,
            membership=ELASTIC,
        )
    else:
        (plan,) = _static_plans(app, args.node, 1 if args.nodes is None else args.nodes)
        _warn_idle_threads(config.threads, len(plan.shards))
        node = app.node(plan, until_empty=args.until_empty, seed=args.seed, membership=STATIC)
    if early.count:
        print("shardq: stopped before the node started", file=sys.stderr)
        return EXIT_OK
    started = time.monotonic()
    code = node.run(lambda: early.count)
    _print_summary(node, time.monotonic() - started)
    return code


def _warn_idle_threads(threads: int, shards: int) -> None:
    """A thread serves whole shards: threads beyond the shards a node could serve idle
    (concurrency, not threads, sets how many jobs run at once)."""
    if shards and threads > shards:
        structlog.get_logger("shardq.node").warning(
            "node.idle_threads",
            threads=threads,
            shards=shards,
            detail=f"{threads - shards} of the {threads} threads have no shard to serve; "
            "threads only receive, jobs run in the node's execution slots: set threads "
            "to at most the shards, and concurrency for jobs at once",
        )


def _plan(args: argparse.Namespace) -> int:
    app, _ = load(args)
    print(format_plan(_static_plans(app, args.node, args.nodes)))
    return EXIT_OK


def _static_plans(app: App, node: int | None, nodes: int) -> list[Plan]:
    """Node ``node``'s plan (None: every node's) over the live layout, checked first."""
    app.plan(node=node or 0, nodes=nodes)  # bad flags are refused before any request
    app.layouts.refresh()
    return [app.plan(node=n, nodes=nodes) for n in ([node] if node is not None else range(nodes))]


def _print_summary(node: Any, elapsed: float) -> None:
    tally = node.tally()
    workers = sorted(set(tally.succeeded) | set(tally.retried) | set(tally.morgued))
    total = sum(tally.succeeded.values())
    name = node.id if node.fleet is not None and node.fleet.elastic else node.plan.node
    print(
        f"\nshardq node {name}: {plural(total, 'job')} succeeded in {elapsed:.1f} s",
        file=sys.stderr,
    )
    if workers:
        rows = [("worker", "succeeded", "retried", "morgued")]
        rows += [
            (w, *(str(n.get(w, 0)) for n in (tally.succeeded, tally.retried, tally.morgued)))
            for w in workers
        ]
        print(textwrap.indent(table(rows), "  "), file=sys.stderr)
