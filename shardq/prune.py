"""``shardq queues ensure --prune``: delete the retired queues of a reshard.

A retired generation's queues (see :mod:`shardq.layout`) are deleted by the nodes
once empty, :data:`~shardq.layout.RETIRE_GRACE_SECONDS` (twice the move's trust
window) after the move ended. This does the same from the command line, for when no
node runs: each queue of a retired generation recorded in the layout document is
deleted only if its grace is over and it holds nothing (no job waiting or in flight),
and the deletion is recorded in the document. A queue of the current or moving
generation is never touched.

The brokers cannot list queues, so queues the layout document does not name (a
generation created by a ``shardq reshard`` killed before it recorded the move) are
not found here: delete those by hand once empty.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from shardq import layout as rules
from shardq.errors import QueueNotFoundError
from shardq.tables import age, utc

if TYPE_CHECKING:
    from shardq.app import App

log = structlog.get_logger("shardq.layout")


@dataclass
class Pruned:
    """What a prune did: queues deleted, and queues kept with why."""

    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)


def prune(app: App, now: float | None = None) -> Pruned:
    """Delete the empty retired queues of the app's workers whose grace is over (at
    ``now``, default the current time), recording each in the layout document."""
    now = time.time() if now is None else now
    done = Pruned()
    doc = app.layouts.refresh()
    if doc is None:
        return done
    for worker, layout in sorted(doc.workers.items()):
        if worker not in app.workers:
            continue  # another app's worker (same prefix): its own app prunes it
        live = {layout.gen} | ({layout.moving.gen} if layout.moving else set())
        for old in layout.retired:
            if old.gen in live:  # never the current or moving generation
                continue
            for shard in old.left:
                _prune_one(app, worker, layout, old, shard, now, done)
    return done


def _prune_one(
    app: App,
    worker: str,
    layout: rules.WorkerLayout,
    old: rules.Retired,
    shard: int,
    now: float,
    done: Pruned,
) -> None:
    queue = app.shard_queue(worker, shard, old.gen)
    if not rules.may_delete(layout, old.gen, shard, now):
        until = old.ended + old.grace
        done.kept.append(
            (
                queue,
                f"retired {age(max(0.0, now - old.ended))} ago; deleted no sooner than "
                f"{utc(until)} UTC ({age(until - now)} from now)",
            )
        )
        return
    try:
        counts = app.broker.counts(queue)
    except QueueNotFoundError:
        counts = None  # deleted already (by a node, or by hand): record it
    if counts is not None and counts.waiting + counts.in_flight:
        done.kept.append(
            (
                queue,
                f"not empty ({counts.waiting} waiting, {counts.in_flight} in flight): a "
                "running node relays them to the current layout; run this again once empty",
            )
        )
        return
    if counts is not None:
        with contextlib.suppress(QueueNotFoundError):  # deleted meanwhile
            app.broker.delete_queue(queue)
    app.layouts.update(worker, lambda w: rules.deleted(w, old.gen, shard))
    log.info("layout.queue_deleted", queue=queue, detail="a retired queue, empty")
    done.deleted.append(queue)
