"""``shardq queues ensure --prune``: delete the retired queues of a reshard.

A retired generation's queues (see :mod:`shardq.layout`) are deleted by the nodes
once empty, twice the trust window after a node saw the move end. This does it from
the command line, for when no node runs: each queue of a retired generation recorded
in the worker's layout item is deleted if a receive finds it empty (and the broker
counts nothing in it), and the deletion is recorded in the item. A publisher whose
send finds a deleted queue reads the layout again and sends to the live one. A queue
of the current or moving generation is never touched.

The brokers cannot list queues, so queues no layout item names (a generation created
by a ``shardq reshard`` killed before it announced the move) are not found here:
delete those by hand once empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from shardq import layout as rules
from shardq.errors import QueueNotFoundError

if TYPE_CHECKING:
    from shardq.app import App

log = structlog.get_logger("shardq.layout")


@dataclass
class Pruned:
    """What a prune did: queues deleted, and queues kept with why."""

    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)


def prune(app: App) -> Pruned:
    """Delete the empty retired queues of the app's workers, recording each."""
    done = Pruned()
    for worker, layout in sorted(app.layouts.refresh().items()):
        live = {layout.gen} | ({layout.moving.gen} if layout.moving else set())
        for old in layout.retired:
            if old.gen in live:  # never the current or moving generation
                continue
            for shard in old.left:
                _prune_one(app, worker, old.gen, shard, done)
    return done


def _prune_one(app: App, worker: str, gen: int, shard: int, done: Pruned) -> None:
    queue = app.shard_queue(worker, shard, gen)
    try:
        counts = app.broker.counts(queue)
        if (
            counts.waiting
            or counts.in_flight
            or app.broker.receive(queue, max_messages=1, wait_seconds=0, visibility_timeout=0)
        ):
            done.kept.append(
                (
                    queue,
                    f"not empty ({counts.waiting} waiting, {counts.in_flight} in flight): a "
                    "running node relays them to the current layout; run this again once empty",
                )
            )
            return
        app.broker.delete_queue(queue)
    except QueueNotFoundError:
        pass  # deleted already (by a node, or by hand): record it
    app.layouts.update(worker, lambda w: rules.deleted(w, gen, shard))
    log.info("layout.queue_deleted", queue=queue, detail="a retired queue, empty")
    done.deleted.append(queue)
