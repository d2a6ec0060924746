"""Upkeep of the morgue by ``shardq queues ensure``: moving the dead jobs of the old
queue-based morgue (``...-morgue.fifo``, record versions 1 and 2) into the store, each
written before its message is deleted, and deleting records past ``morgue_retention_days``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardq.broker.base import Message, release_now
from shardq.core.envelope import NestedTooDeeply, parse_json
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.core.terminal import plural
from shardq.morgue import Morgue, bury
from shardq.morgue.record import KIND, STRINGS, MorgueRecord, checked, unreadable

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment


def tend(app: Deployment) -> list[str]:
    """Move each worker's old morgue queue into the store, apply the retention; what
    was done, one line each."""
    lines = []
    days = app.config.morgue_retention_days
    for name in app.workers:
        if moved := move_queue_morgue(app, name):
            lines.append(f"moved {plural(moved, f'dead {name} job')} from the morgue queue")
        if days is not None and (gone := Morgue(app, name).expire(days)):
            lines.append(
                f"deleted {plural(gone, f'dead {name} job')} older than {days} days "
                "(morgue_retention_days)"
            )
    return lines


def move_queue_morgue(app: Deployment, worker: str) -> int:
    """Move every dead job of ``worker``'s old morgue queue into the store; how many."""
    queue = app.morgue_queue(worker)
    broker = app.broker
    if broker.queue_settings(queue) is None:
        return 0
    moved = 0
    while batch := broker.receive(
        queue, max_messages=MAX_BATCH_ENTRIES, wait_seconds=0, visibility_timeout=120
    ):
        written: list[str] = []
        try:
            for message in batch:
                bury(app.store, worker, [read_queue_record(message)], at_death=True)
                written.append(message.receipt)
        finally:
            if written:
                broker.delete_batch(queue, written)
            release_now(broker, [m for m in batch if m.receipt not in written])
        moved += len(written)
    return moved


def read_queue_record(message: Message) -> MorgueRecord:
    """The record of an old morgue message; one shardq cannot read as unreadable."""
    try:
        return _decode(message)
    except ValueError as exc:
        return unreadable(
            str(exc),
            message.group_id,
            message.message_id,
            failed_at=message.sent_at,
            first_sent_at=message.sent_at,
            body=message.body,
        )


def _decode(message: Message) -> MorgueRecord:
    header, newline, body = message.body.partition("\n")
    try:
        doc = parse_json(header if newline else message.body)
    except NestedTooDeeply:
        raise ValueError("nested too deeply to be a morgue record") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError("not a shardq morgue record")
    version = doc.get("v")
    if version == 1 and not newline:
        if not isinstance(doc.get("body"), str):
            raise ValueError("field body is not a string")
        body = doc["body"]
    elif version == 2 and newline:
        if doc.get("body_kept") is False:
            body = ""  # too large for the old morgue queue: only why it died was kept
    else:
        raise ValueError(f"morgue record version {version!r} is not supported")
    checked(doc, (*STRINGS, "source_queue", "attempts", "failed_at"))
    if not 0 <= doc["failed_at"] < 1e11:
        raise ValueError("field failed_at is not a time")
    if doc["entity_id"] != message.group_id:
        raise ValueError(
            f"it names entity {doc['entity_id']!r} but sits in group {message.group_id!r}"
        )
    return MorgueRecord(
        **{k: doc[k] for k in (*STRINGS, "source_queue", "attempts")},
        failed_at=float(doc["failed_at"]),  # first_sent_at: the old records did not keep it
        body=body,
    )
