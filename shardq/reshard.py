"""``shardq reshard WORKER --shards N``: change a live worker's number of shards.

The command creates the new generation's queues, records the move in the layout
document and (unless ``--no-wait``) follows it until it ends. The nodes do the rest
(:mod:`shardq.layout_keeper`), so killing this command, or every node, leaves
nothing half done: the move goes on when nodes run. See :mod:`shardq.layout` for
the procedure and its guarantees, docs/operations.md for its use.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardq import layout as rules
from shardq.app import App
from shardq.errors import BrokerError, LayoutError
from shardq.layout import WorkerLayout
from shardq.layout_view import old_jobs
from shardq.limits import MAX_QUEUE_NAME_LENGTH
from shardq.worker import MAX_SHARDS

#: Seconds between two progress lines of ``shardq reshard``.
FOLLOW_SECONDS = 5.0

_EXAMPLES = """examples:
  shardq reshard SyncOrder --shards 16          # start, then follow until it ends
  shardq reshard SyncOrder --shards 4 --no-wait # start and return

Publishers and nodes keep running. An entity's jobs published before the change all
finish (or reach the morgue) before its first job published after it starts. The
move ends when every old shard has emptied; its queues are deleted two minutes
later. `shardq stats` shows a reshard in progress.
"""


@dataclass(frozen=True)
class Progress:
    """Where a reshard stands: old shards still open and the jobs still in them."""

    worker: str
    layout: WorkerLayout
    old_jobs: int | None  # None: the counts could not be read

    @property
    def done(self) -> bool:
        return self.layout.moving is None


def start(app: App, worker: str, shards: int, *, by: str | None = None) -> WorkerLayout:
    """Begin moving ``worker`` to ``shards`` shards; returns the new layout. Raises
    :class:`~shardq.errors.LayoutError` if refused (a reshard under way, same count,
    out of range), before creating anything."""
    app.worker(worker)
    app.layouts.refresh()
    now, trust = time.time(), app.config.reshard_trust_seconds
    planned = rules.start(app.layouts.cached(worker), worker, shards, now, by or "", trust)
    longest = app.shard_queue(worker, shards - 1, planned.gen)
    if len(longest) > MAX_QUEUE_NAME_LENGTH:
        raise LayoutError(
            f"the new layout's queues would be named up to {longest} ({len(longest)} "
            f"characters); SQS allows {MAX_QUEUE_NAME_LENGTH}. Give {worker} a shorter "
            "queue_name (a new name starts a new set of queues: drain the old ones first)"
        )
    for shard in range(shards):  # queues first: publishers that switch find them
        app.ensure_queue(app.shard_queue(worker, shard, planned.gen), worker)
    app.ensure_queue(app.morgue_queue(worker), worker)
    who = by or f"shardq reshard on {socket.gethostname()} (pid {os.getpid()})"
    layout = app.layouts.update(
        worker, lambda current: rules.start(current, worker, shards, now, who, trust)
    )
    return layout


def progress(app: App, worker: str) -> Progress:
    """A fresh look at ``worker``'s reshard (one request per old queue)."""
    app.layouts.refresh()
    layout = app.layouts.cached(worker)
    try:
        return Progress(worker, layout, old_jobs(app, worker, layout))
    except BrokerError:
        return Progress(worker, layout, None)


def describe(p: Progress) -> str:
    move = p.layout.moving
    if move is None:
        return f"{p.worker}: {p.layout.shards} shards (generation {p.layout.gen}); no reshard"
    jobs = "?" if p.old_jobs is None else str(p.old_jobs)
    waited = time.time() - move.started
    phase = (
        f"publishers switch to the new layout in {move.switch - time.time():.0f} s"
        if time.time() < move.switch
        else f"{len(move.left)} of {move.shards} old shards still open"
    )
    return (
        f"{p.worker}: {move.shards} -> {p.layout.shards} shards, {waited:.0f} s in; {phase}; "
        f"{jobs} jobs still in the old layout"
    )


def follow(
    app: App, worker: str, out: Callable[[str], None], every: float = FOLLOW_SECONDS
) -> Progress:
    """Print progress every ``every`` seconds until the move ends."""
    while True:
        p = progress(app, worker)
        out(describe(p))
        if p.done:
            return p
        time.sleep(every)


# -- the command -------------------------------------------------------------------------
def add_command(
    commands: Any, common: Callable[[argparse.ArgumentParser], None], load: Any
) -> None:
    p = commands.add_parser(
        "reshard",
        help="change a live worker's number of shards, keeping each entity's order",
        description="Change a live worker's number of shards while publishers and nodes run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES,
    )
    common(p)
    p.add_argument("worker", help="the worker class name")
    p.add_argument("--shards", type=int, required=True, help=f"the new number (1..{MAX_SHARDS})")
    p.add_argument("--no-wait", action="store_true", help="return once the reshard has begun")
    p.set_defaults(handler=lambda args: _reshard(load(args), args))


def _reshard(app: App, args: argparse.Namespace) -> int:
    before = app.layouts.get(args.worker, max_age=0)
    after = start(app, args.worker, args.shards)
    print(
        f"{args.worker}: reshard from {before.shards} to {after.shards} shards begun "
        f"(layout generation {after.gen}). Publishers switch to it in "
        f"{app.config.reshard_trust_seconds:.0f} s; each old shard then closes once empty.",
        flush=True,
    )
    if args.no_wait:
        return 0
    print("following it (Ctrl-C stops following; the nodes finish the reshard)", flush=True)
    try:
        follow(app, args.worker, lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("\nstopped following; the reshard goes on", file=sys.stderr)
        return 0
    print(f"{args.worker}: reshard done", flush=True)
    return 0
