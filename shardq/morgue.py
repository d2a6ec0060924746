"""The morgue: one FIFO queue per worker for jobs that will not be retried.

:class:`MorgueQueue` lists, requeues and purges dead jobs, by worker and entity.
A FIFO queue cannot be browsed, only received from: operations receive morgue
messages with a ``hold`` visibility timeout, act on the matching ones and release
the others at the end. So a listing shows at most the first 10 dead jobs of each
entity (SQS blocks an entity's later messages while earlier ones are held);
requeue or purge them to reach the rest.

A morgue message keeps the job's original body untouched and adds why it died.
Its group id is the job's entity, so requeued jobs keep their entity's order among
themselves; its deduplication id is the job's message id, so a node that crashes
between writing the morgue record and deleting the job does not record it twice
(within SQS's 5-minute dedup window).
"""

from __future__ import annotations

import json
import math
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardq import envelope
from shardq.broker.base import Message, SendEntry, batches
from shardq.errors import BrokerError, EnvelopeError
from shardq.limits import MAX_BATCH_ENTRIES
from shardq.sharding import shard_for

if TYPE_CHECKING:
    from shardq.app import App

KIND = "shardq.morgue"
VERSION = 1
MAX_TRACEBACK_CHARS = 8000

#: Why a job is in the morgue.
REASON_MAX_RETRIES = "max_retries"
REASON_PERMANENT = "permanent_error"
REASON_INVALID = "invalid_message"
REASON_UNKNOWN_WORKER = "unknown_worker"
REASON_FOREIGN = "foreign_message"  # not a readable shardq morgue record


@dataclass(frozen=True)
class MorgueRecord:
    """A dead job: its original body and why it died."""

    body: str
    entity_id: str
    reason: str
    error_type: str
    error_message: str
    traceback: str
    attempts: int
    failed_at: float
    source_queue: str
    message_id: str


def record_for(message: Message, reason: str, error: BaseException, attempts: int) -> MorgueRecord:
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return MorgueRecord(
        body=message.body,
        entity_id=message.group_id,
        reason=reason,
        error_type=type(error).__name__,
        error_message=str(error)[:2000],
        traceback=tb[-MAX_TRACEBACK_CHARS:],
        attempts=attempts,
        failed_at=time.time(),
        source_queue=message.queue,
        message_id=message.message_id,
    )


def encode(record: MorgueRecord, max_bytes: int) -> str:
    """The morgue message body, dropping the traceback if the whole would not fit."""
    doc: dict[str, Any] = {"kind": KIND, "v": VERSION, **record.__dict__}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode("utf-8")) > max_bytes:
        doc["traceback"] = "(dropped: the job's body leaves no room for it)"
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return text


def decode(text: str) -> MorgueRecord:
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError("not a shardq morgue record")
    fields = {k: doc[k] for k in MorgueRecord.__dataclass_fields__}
    for name, value in fields.items():  # anyone who can write to the queue can forge one
        wanted = (int, float) if name == "failed_at" else int if name == "attempts" else str
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise TypeError(f"morgue record field {name!r} has the wrong type")
    if not math.isfinite(fields["failed_at"]):
        raise ValueError("morgue record field 'failed_at' is not a finite time")
    return MorgueRecord(**fields)


def entry(record: MorgueRecord, max_bytes: int) -> SendEntry:
    return SendEntry("0", encode(record, max_bytes), record.entity_id, record.message_id)


Progress = Callable[[int], None]


class MorgueQueue:
    """One worker's morgue: list, requeue and purge its dead jobs."""

    def __init__(self, app: App, worker: str, *, hold: float = 120.0) -> None:
        self.app = app
        self.worker = app.worker(worker).__name__
        self.queue = app.morgue_queue(self.worker)
        self.hold = hold

    def size(self) -> int:
        counts = self.app.broker.counts(self.queue)
        return counts.waiting + counts.in_flight

    def list_jobs(self, entity: str | None = None, limit: int = 100) -> list[MorgueRecord]:
        """Dead jobs, oldest first per entity (at most the first 10 of each entity)."""
        found: list[MorgueRecord] = []

        def keep(batch: list[tuple[Message, MorgueRecord]]) -> set[str]:
            found.extend(r for _, r in batch[: limit - len(found)])
            return set()

        self._scan(entity, None, keep, stop=lambda: len(found) >= limit)
        return found

    def requeue(
        self,
        entity: str | None = None,
        message_ids: Iterable[str] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Send matching dead jobs back to their shard, at the tail of their entity's
        jobs (in their morgue order), then remove them from the morgue."""
        return self._scan(entity, message_ids, self._resend, progress=progress)

    def purge(
        self,
        entity: str | None = None,
        message_ids: Iterable[str] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete matching dead jobs for good."""
        return self._scan(
            entity, message_ids, lambda batch: {m.receipt for m, _ in batch}, progress=progress
        )

    # -- internals ---------------------------------------------------------------
    def _scan(
        self,
        entity: str | None,
        message_ids: Iterable[str] | None,
        act: Callable[[list[tuple[Message, MorgueRecord]]], set[str]],
        progress: Progress | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Receive everything once; ``act`` on matches and returns the receipts to delete."""
        broker = self.app.broker
        wanted = None if message_ids is None else set(message_ids)
        held: list[Message] = []
        done = 0
        try:
            while not stop():
                batch = broker.receive(
                    self.queue,
                    max_messages=MAX_BATCH_ENTRIES,
                    wait_seconds=0,
                    visibility_timeout=self.hold,
                )
                if not batch:
                    break
                matching = []
                for message in batch:
                    record = _decode_or_placeholder(message)
                    if (entity is None or record.entity_id == entity) and (
                        wanted is None or record.message_id in wanted
                    ):
                        matching.append((message, record))
                    else:
                        held.append(message)
                finished = act(matching) if matching else set()
                held += [m for m, _ in matching if m.receipt not in finished]
                if finished:
                    result = broker.delete_batch(self.queue, sorted(finished))
                    done += len(finished) - len(result.failed)
                    if progress is not None:
                        progress(done)
                if wanted is not None and done >= len(wanted):
                    break
        finally:
            for chunk in batches(held):
                broker.change_visibility_batch(self.queue, [(m.receipt, 0) for m in chunk])
        return done

    def _resend(self, batch: list[tuple[Message, MorgueRecord]]) -> set[str]:
        by_queue: dict[str, list[tuple[Message, SendEntry]]] = {}
        settings = self.app.settings(self.worker)
        for message, record in batch:
            shard = shard_for(record.entity_id, settings.shards)
            queue = self.app.shard_queue(self.worker, shard)
            entry = SendEntry(
                str(len(by_queue.get(queue, []))), record.body, record.entity_id, uuid.uuid4().hex
            )
            by_queue.setdefault(queue, []).append((message, entry))
        sent: set[str] = set()
        for queue, items in by_queue.items():
            self.app.ensure_queue(queue, self.worker)
            try:
                result = self.app.broker.send_batch(queue, [e for _, e in items])
            except BrokerError:
                continue  # nothing of this batch was sent: leave it in the morgue
            for message, entry in items:
                if entry.id in result.message_ids:
                    sent.add(message.receipt)
                else:  # keep the entity's later dead jobs from overtaking this one
                    break
        return sent


def _decode_or_placeholder(message: Message) -> MorgueRecord:
    """A morgue message written by someone else still shows up, as what it is."""
    try:
        return decode(message.body)
    except (ValueError, KeyError, TypeError, RecursionError):
        return MorgueRecord(
            body=message.body,
            entity_id=message.group_id,
            reason=REASON_FOREIGN,
            error_type="",
            error_message="not a shardq morgue record",
            traceback="",
            attempts=0,
            failed_at=message.sent_at,
            source_queue="",
            message_id=message.message_id,
        )


def payload_of(record: MorgueRecord, signing_key: bytes | None = None) -> Any:
    """The dead job's payload, or None if its body is not a valid envelope."""
    try:
        return envelope.decode(record.body, signing_key).payload
    except EnvelopeError:
        return None
