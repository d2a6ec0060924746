"""``shardq reshard WORKER --shards N``: create the new queues, announce the move, and
follow it (writing the switch when due); the nodes do the rest (docs/operations.md)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass

from shardq.api.app import App
from shardq.core import layout as rules
from shardq.core.errors import LayoutError, ShardqError
from shardq.core.exits import EXIT_INTERRUPTED, EXIT_OK
from shardq.core.layout import WorkerLayout
from shardq.core.signals import StopSignals
from shardq.core.topology import too_long
from shardq.ops.layout_view import ReshardView, layout_view
from shardq.ops.stats import collect

#: Seconds between two progress lines of ``shardq reshard``.
FOLLOW_SECONDS = 5.0

EXAMPLES = """\
  shardq reshard SyncOrder --shards 16          # start, then follow until it ends
  shardq reshard SyncOrder --shards 4 --no-wait # start and return

Publishers and nodes keep running. An entity's jobs published before the change all
finish (or reach the morgue) before its first job published after it starts. The
move ends when every old shard has emptied; its queues are deleted, once empty,
twice the trust window later. `shardq stats` shows a reshard in progress.
"""


@dataclass(frozen=True)
class Progress:
    """The layout read, and the move as `shardq stats` shows it while there is one."""

    worker: str
    layout: WorkerLayout
    view: ReshardView | None = None

    @property
    def done(self) -> bool:
        return self.layout.moving is None


def start(app: App, worker: str, shards: int, *, by: str | None = None) -> WorkerLayout:
    """Announce a move of ``worker`` to ``shards`` shards; LayoutError if refused, before
    creating anything."""
    trust = app.config.reshard_trust_seconds
    who = by or f"shardq reshard on {socket.gethostname()} (pid {os.getpid()})"
    planned = rules.announce(app.layouts.read(worker, check=False), worker, shards, trust, who)
    problem = too_long(app.shard_queue(worker, shards - 1, planned.gen))
    if problem:
        raise LayoutError(
            f"the new layout's queues would be named up to {problem}. Give {worker} a "
            "shorter queue_name (a new name starts a new set of queues: drain the old ones first)"
        )
    for shard in range(shards):  # queues first: publishers that switch find them
        app.ensure_queue(app.shard_queue(worker, shard, planned.gen), worker)
    return app.layouts.update(worker, lambda now: rules.announce(now, worker, shards, trust, who))


def progress(app: App, worker: str) -> Progress:
    """A fresh look at ``worker``'s reshard; writes the switch when due."""
    app.layouts.read(worker)
    layout = app.layouts.switch_if_due(worker)
    try:
        views = [w.layout for w in collect(app).workers if w.name == worker and w.layout]
    except ShardqError:  # the counts or the fleet could not be read: the item alone
        views = []
    view = views[0].reshard if views else None
    if view is None:  # no view read, or it read the layout at another moment
        view = layout_view(worker, layout, app.settings(worker).shards, None).reshard
    return Progress(worker, layout, view)


def describe(p: Progress) -> str:
    if p.view is None:
        return f"{p.worker}: {p.layout.shards} shards (generation {p.layout.gen}); no reshard"
    return p.view.text()


def reshard_command(app: App, args: argparse.Namespace) -> int:
    """The ``shardq reshard`` command (registered in :mod:`shardq.ops.admin`)."""
    before = app.layouts.read(args.worker, check=False)
    after = start(app, args.worker, args.shards)
    print(
        f"{args.worker}: reshard from {before.shards} to {after.shards} shards announced "
        f"(layout generation {after.gen}). Publishers switch to it once {after.trust:.0f} s "
        "have passed (on this command's clock, or a node's); each old shard then closes "
        "once empty.",
        flush=True,
    )
    if args.no_wait:
        return EXIT_OK
    stopping = threading.Event()  # Ctrl-C: seen between reads, never inside one
    ctrl_c = StopSignals(stopping, (signal.SIGINT,))
    try:
        ctrl_c.install()
        print("following it (Ctrl-C stops following; the nodes finish the reshard)", flush=True)
        while not (done := progress(app, args.worker)).done and not stopping.is_set():
            print(describe(done), flush=True)
            stopping.wait(FOLLOW_SECONDS)
    except KeyboardInterrupt:  # before the handler was in place
        stopping.set()
    finally:
        ctrl_c.restore()
    if stopping.is_set():
        print("\nstopped following; the reshard goes on", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(describe(done), flush=True)
    print(f"{args.worker}: reshard done", flush=True)
    return EXIT_OK
