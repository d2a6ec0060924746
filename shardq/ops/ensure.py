"""``shardq queues ensure``: create the queues of the live layouts (the old generation's
too during a reshard) and the DynamoDB state table of ``sqs://``, report queues that
drifted, tend the morgue (:mod:`shardq.morgue.migrate`), and with ``--prune`` delete
retired queues (:mod:`shardq.reshard.prune`)."""

from __future__ import annotations

import json
import sys

from shardq.api.app import App
from shardq.core.exits import EXIT_DRIFT, EXIT_OK
from shardq.core.limits import MAX_RETENTION_SECONDS
from shardq.core.terminal import plural
from shardq.core.topology import parse_name
from shardq.morgue.migrate import tend
from shardq.ops.layout_view import layout_view
from shardq.reshard.prune import prune

PRUNE_HELP = (
    "also delete the queues of retired layout generations (after a reshard) that are "
    "empty, and record it in the worker's layout item; a queue holding jobs is kept and "
    "named. Only generations a layout item records are pruned (the brokers cannot list "
    "queues): queues of a reshard killed before it was announced are left alone"
)


def ensure(app: App, *, with_prune: bool = False) -> int:
    """The command: create, check, optionally prune; exit 4 if any queue drifted."""
    app.check()
    ensure_state_table(app)  # before anything reads the layouts from it
    app.layouts.refresh()
    broker = app.broker
    drift: list[str] = []
    notes: list[str] = []
    created = checked = 0
    for name in app.workers:
        settings = app.settings(name)
        view = layout_view(name, app.layouts.cached(name), settings.shards, None)
        if view.note:
            notes.append(view.note)
        queues = [
            app.shard_queue(name, shard, parse_name(gen_name)[1])
            for gen_name, count in app.live_shards(name).items()
            for shard in range(count)
        ]
        for queue in queues:
            found = broker.queue_settings(queue)
            if found is None:
                app.ensure_queue(queue, name)
                created += 1
                continue
            checked += 1
            if not found.fifo:
                drift.append(f"{queue}: not a FIFO queue")
            if found.content_based_dedup:
                drift.append(f"{queue}: ContentBasedDeduplication is on (shardq sets ids itself)")
            if found.retention_seconds not in (None, MAX_RETENTION_SECONDS):
                drift.append(
                    f"{queue}: MessageRetentionPeriod is {found.retention_seconds} s, shardq "
                    f"sets {MAX_RETENTION_SECONDS} s (14 days): older jobs are deleted unrun"
                )
            if found.redrive_policy:
                policy = json.loads(found.redrive_policy)
                drift.append(
                    f"{queue}: RedrivePolicy moves a job to {policy.get('deadLetterTargetArn')} "
                    f"after {policy.get('maxReceiveCount')} receives (each retry and release "
                    "is one), unrun and out of its entity's order; remove it (dead jobs go to "
                    "the morgue)"
                )
            if found.visibility_timeout != settings.visibility_timeout:
                drift.append(
                    f"{queue}: VisibilityTimeout is {found.visibility_timeout} s, "
                    f"{name}.visibility_timeout is {settings.visibility_timeout} s"
                )
    for line in drift:
        print(f"drift: {line}")
    for line in tend(app):  # the old morgue queues, morgue_retention_days
        print(f"morgue: {line}")
    for line in notes:
        print(f"layout: {line}", file=sys.stderr)
    summary = f"{plural(created, 'queue')} created, {checked} checked, {len(drift)} drifted"
    if with_prune:
        pruned = prune(app)
        for queue in pruned.deleted:
            print(f"pruned: {queue}")
        for queue, why in pruned.kept:
            print(f"kept: {queue}: {why}")
        summary += f", {len(pruned.deleted)} retired deleted, {len(pruned.kept)} retired kept"
    print(summary, file=sys.stderr)
    return EXIT_DRIFT if drift else EXIT_OK


def ensure_state_table(app: App) -> None:
    """Create the app's DynamoDB state table unless it exists (the embedded store's
    table is made with the broker's file)."""
    store = app.store
    if store.kind != "dynamodb":
        return
    from shardq.store.dynamo import DynamoStore

    if isinstance(store, DynamoStore):
        created = store.ensure_table()
        print(f"state table {store.table} {'created' if created else 'checked'} (DynamoDB)")
