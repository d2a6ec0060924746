"""Relaying jobs that reached a closed or retired shard to the current layout, body
unchanged; deduplicated by message id, so a relay done again is not sent twice."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING

import structlog

from shardq.broker.base import Broker, Message, SendEntry, SendResult, batches, valid_entries
from shardq.core.errors import BrokerError, EnvelopeError, QueueNotFoundError
from shardq.core.topology import shard_for

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.layout")


def relay(app: Deployment, worker: str, messages: Sequence[Message]) -> dict[str, str]:
    """Send ``messages`` (in receive order) to ``worker``'s current layout; BrokerError
    unless every one was accepted or refused for good (the caller deletes them only then).
    Those refused for good (a body an older shardq stored that SQS refuses) are not sent:
    returned, by message id, with why (the caller buries them: their entity moves on)."""
    layout = app.layouts.cached(worker)
    refused: dict[str, str] = {}
    by_queue: dict[str, list[Message]] = {}
    for m in messages:
        queue = app.shard_queue(worker, shard_for(m.group_id, layout.shards), layout.gen)
        by_queue.setdefault(queue, []).append(m)
    for queue, queued in by_queue.items():
        app.ensure_queue(queue, worker)
        for chunk in (c for r in _rounds(queued) for c in batches(r, _size)):
            entries = [
                SendEntry(str(i), m.body, m.group_id, f"relay-{m.message_id}"[:128])
                for i, m in enumerate(chunk)
            ]
            bad = SendResult()
            valid = valid_entries(entries, partial(app.broker.max_message_bytes, queue), bad)
            refused.update((chunk[int(i)].message_id, why) for i, why in bad.failed.items())
            if valid and (result := app.broker.send_batch(queue, valid)).failed:
                why = "; ".join(sorted(set(result.failed.values())))
                raise BrokerError(f"relaying {len(result.failed)} jobs to {queue} failed: {why}")
    log.info("layout.relayed", worker=worker, jobs=len(messages) - len(refused), to_gen=layout.gen)
    return refused


def unrelayable(why: str) -> EnvelopeError:
    """What a job :func:`relay` refused for good dies of (in the morgue as invalid)."""
    return EnvelopeError(f"not relayed to the current layout, refused for good: {why}")


def _size(message: Message) -> int:
    return len(message.body.encode("utf-8"))  # a batch takes at most 1 MiB


def _rounds(messages: Sequence[Message]) -> Iterator[list[Message]]:
    """Consecutive runs holding at most one job of an entity: SQS may accept an entity's
    later job of a batch after refusing an earlier one, and the relay stops at a refusal."""
    run: list[Message] = []
    for m in messages:
        if any(m.group_id == other.group_id for other in run):
            yield run
            run = []
        run.append(m)
    if run:
        yield run


def holding(broker: Broker, queue: str) -> str:
    """What ``queue`` holds, "" if a receive finds it empty or it does not exist (the
    broker's counts, approximate on SQS, may only veto)."""
    try:
        counts = broker.counts(queue)
        if counts.waiting or counts.in_flight:
            return f"{counts.waiting} waiting, {counts.in_flight} in flight"
        found = broker.receive(queue, max_messages=1, wait_seconds=0, visibility_timeout=0)
    except QueueNotFoundError:
        return ""
    return "a receive found a job" if found else ""


def delete_if_empty(broker: Broker, queue: str) -> str:
    """Delete the retired ``queue`` unless it holds jobs: what it holds, "" if deleted."""
    held = holding(broker, queue)
    if not held:
        with suppress(QueueNotFoundError):  # deleted already
            broker.delete_queue(queue)
        log.info("layout.queue_deleted", queue=queue, detail="a retired queue, empty")
    return held
