"""``shardq queues ensure --prune``: delete the empty retired queues of a reshard.

For when no node runs (nodes do the same once the grace has passed): each queue of
a retired generation named in a layout item is deleted if a receive finds it empty,
and the deletion recorded in the item. Queues no item names (a reshard killed before
it announced) are not found: delete those by hand once empty.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from shardq.core import layout as rules
from shardq.core.errors import QueueNotFoundError
from shardq.publish.relay import holding

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.layout")


@dataclass
class Pruned:
    """What a prune did: queues deleted, and queues kept with why."""

    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)


def prune(app: Deployment) -> Pruned:
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


def _prune_one(app: Deployment, worker: str, gen: int, shard: int, done: Pruned) -> None:
    queue = app.shard_queue(worker, shard, gen)
    held = holding(app.broker, queue)
    if held:
        why = f"not empty ({held}): a running node relays them to the current layout"
        done.kept.append((queue, f"{why}; run this again once empty"))
        return
    with suppress(QueueNotFoundError):  # deleted already (by a node, or by hand): record it
        app.broker.delete_queue(queue)
    app.layouts.update(worker, lambda w: rules.deleted(w, gen, shard))
    log.info("layout.queue_deleted", queue=queue, detail="a retired queue, empty")
    done.deleted.append(queue)
