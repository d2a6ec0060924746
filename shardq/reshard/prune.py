"""``shardq queues ensure --prune``: delete the empty retired queues that layout items
name, as nodes do once the grace passed, for when no node runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from shardq.core import layout as rules
from shardq.publish.relay import delete_if_empty

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment


@dataclass
class Pruned:
    deleted: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # queue, why


def prune(app: Deployment) -> Pruned:
    done = Pruned()
    for worker, layout in sorted(app.layouts.refresh().items()):
        live = {layout.gen} | ({layout.moving.gen} if layout.moving else set())
        for old in (r for r in layout.retired if r.gen not in live):  # never a live one
            for shard in old.left:
                queue = app.shard_queue(worker, shard, old.gen)
                if held := delete_if_empty(app.broker, queue):
                    why = f"not empty ({held}): a running node relays them to the current layout"
                    done.kept.append((queue, f"{why}; run this again once empty"))
                    continue
                app.layouts.update(worker, partial(rules.deleted, gen=old.gen, shard=shard))
                done.deleted.append(queue)
    return done
