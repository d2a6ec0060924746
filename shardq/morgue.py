"""The morgue: one FIFO queue per worker for jobs that will not be retried.

:class:`MorgueQueue` lists, requeues and purges dead jobs, by worker and entity.
A FIFO queue cannot be browsed, only received from, and while some of an entity's
messages are received (in flight), the queue returns none of its later ones. So a
listing receives the morgue with a ``hold`` visibility timeout until it returns
nothing, then, for each entity, releases what it holds of that entity and receives
again to reach the entity's later dead jobs; it releases everything at the end. One
receive returns at most 10 messages, so an entity's dead jobs beyond its first 10
cannot be listed without removing the first ones: :class:`MorgueListing` says how
many dead jobs a listing did not reach. Requeue and purge remove what they act on,
so they reach every dead job.

The record format (header line plus the original body) is in
:mod:`shardq.morgue_record`. A morgue message's group id is the job's entity, so
requeued jobs keep their entity's order among themselves; its deduplication id is
the job's message id, so a node that crashes between writing the morgue record and
deleting the job does not record it twice (within SQS's 5-minute dedup window).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardq import envelope
from shardq.broker.base import Message, SendEntry
from shardq.errors import BrokerError, EnvelopeError
from shardq.layout import publish_to
from shardq.leases import release_now
from shardq.limits import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES
from shardq.morgue_record import (
    KIND,
    REASON_INVALID,
    REASON_MAX_RETRIES,
    REASON_PERMANENT,
    REASON_UNKNOWN_WORKER,
    REASON_UNREADABLE,
    VERSION,
    MorgueRecord,
    decode,
    encode,
    entry,
    record_for,
    requeue_problem,
    unreadable,
)
from shardq.sharding import shard_for

if TYPE_CHECKING:
    from shardq.app import App

#: Most morgue messages one listing receives (it holds them all until it ends).
MAX_SCAN = 10_000


@dataclass(frozen=True)
class MorgueListing:
    """What a listing found: ``records`` (oldest first per entity) and what it missed."""

    records: list[MorgueRecord]
    #: Dead jobs in the morgue, counted as the listing ended (approximate on SQS).
    size: int
    #: Distinct dead jobs the listing received, shown or not (filters, limit).
    reached: int
    #: True if ``limit`` stopped the listing before it reached everything.
    limited: bool
    #: Entities that may have dead jobs beyond the ones reached (one receive returned
    #: 10 of theirs: their later ones hide behind those until they leave the morgue).
    capped: frozenset[str] = frozenset()

    @property
    def unreached(self) -> int:
        """Dead jobs the listing never received: beyond the limit, an entity's jobs
        behind its first 10, or jobs someone else held meanwhile."""
        return max(0, self.size - self.reached)


Progress = Callable[[int], None]
#: Told of each dead job a requeue leaves in the morgue, and why.
Refused = Callable[[MorgueRecord, str], None]
Act = Callable[[list[tuple[Message, MorgueRecord]]], set[str]]


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
        """Dead jobs, oldest first per entity (see :meth:`browse` for what it misses)."""
        return self.browse(entity, limit).records

    def browse(
        self,
        entity: str | None = None,
        limit: int = 100,
        message_ids: Iterable[str] | None = None,
    ) -> MorgueListing:
        """At most ``limit`` matching dead jobs, oldest first per entity, and how many
        dead jobs the listing did not reach. Leaves the morgue as it was."""
        return _Browse(self, entity, limit, message_ids).run()

    def requeue(
        self,
        entity: str | None = None,
        message_ids: Iterable[str] | None = None,
        progress: Progress | None = None,
        refused: Refused | None = None,
    ) -> int:
        """Send matching dead jobs back to their shard, at the tail of their entity's
        jobs (in their morgue order), then remove them from the morgue.

        A dead job that cannot be requeued (an unreadable record, a body too large to
        have been kept) stays in the morgue and is passed to ``refused`` with the
        reason; while it stays, its entity's later dead jobs stay behind it."""

        def resend(batch: list[tuple[Message, MorgueRecord]]) -> set[str]:
            sendable = []
            for message, record in batch:
                problem = requeue_problem(record)
                if problem is None:
                    sendable.append((message, record))
                elif refused is not None:
                    refused(record, problem)
            return self._resend(sendable) if sendable else set()

        return self._scan(entity, message_ids, resend, progress=progress)

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
    def receive(self) -> list[Message]:
        return self.app.broker.receive(
            self.queue, max_messages=MAX_BATCH_ENTRIES, wait_seconds=0, visibility_timeout=self.hold
        )

    def release(self, messages: Iterable[Message]) -> None:
        """Make held dead jobs visible again (a failure is logged, never raised: it must
        not mask the error that ended a scan; they reappear after ``hold`` anyway)."""
        release_now(self.app.broker, list(messages))

    def _scan(
        self,
        entity: str | None,
        message_ids: Iterable[str] | None,
        act: Act,
        progress: Progress | None = None,
    ) -> int:
        """Receive everything once; ``act`` on matches and returns the receipts to delete."""
        broker = self.app.broker
        wanted = None if message_ids is None else set(message_ids)
        held: list[Message] = []
        done = 0
        try:
            while batch := self.receive():
                matching = []
                for message in batch:
                    record = read(message)
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
            self.release(held)
        return done

    def _resend(self, batch: list[tuple[Message, MorgueRecord]]) -> set[str]:
        by_queue: dict[str, list[tuple[Message, SendEntry]]] = {}
        # the live layout, as publishers see it
        gen, shards = publish_to(self.app.layouts.get(self.worker))
        for message, record in batch:
            shard = shard_for(record.entity_id, shards)
            queue = self.app.shard_queue(self.worker, shard, gen)
            item = SendEntry("", record.body, record.entity_id, uuid.uuid4().hex)
            by_queue.setdefault(queue, []).append((message, item))
        sent: set[str] = set()
        for queue, items in by_queue.items():
            self.app.ensure_queue(queue, self.worker)
            stopped: set[str] = set()  # entities whose earlier dead job was not sent
            for chunk in _send_chunks(items):
                chunk = [(m, e) for m, e in chunk if e.group_id not in stopped]
                if not chunk:
                    continue
                entries = [
                    SendEntry(str(i), e.body, e.group_id, e.dedup_id)
                    for i, (_, e) in enumerate(chunk)
                ]
                try:
                    result = self.app.broker.send_batch(queue, entries)
                    accepted = set(result.message_ids)
                except BrokerError:
                    accepted = set()  # nothing of this batch was sent: it stays in the morgue
                for (message, item), sent_entry in zip(chunk, entries, strict=True):
                    if sent_entry.id in accepted and item.group_id not in stopped:
                        sent.add(message.receipt)
                    else:  # keep the entity's later dead jobs from overtaking this one
                        stopped.add(item.group_id)
        return sent


class _Browse:
    """One listing: a sweep of the morgue, then one pass per entity (see the module doc)."""

    def __init__(
        self,
        morgue: MorgueQueue,
        entity: str | None,
        limit: int,
        message_ids: Iterable[str] | None,
    ) -> None:
        self.morgue, self.entity, self.limit = morgue, entity, max(0, limit)
        self.wanted = None if message_ids is None else set(message_ids)
        self.held: dict[str, Message] = {}  # message id -> its latest receive
        self.groups: dict[str, list[str]] = {}  # group id -> its message ids, in order
        self.found: dict[str, MorgueRecord] = {}  # matching records by morgue message id
        self.seen: set[str] = set()
        self.capped: set[str] = set()

    def run(self) -> MorgueListing:
        try:
            self._sweep()
            if not self._full():
                self._follow_groups(self.morgue.size())
            size = self.morgue.size()
        finally:
            self.morgue.release(self.held.values())
        records = [self.found[i] for ids in self.groups.values() for i in ids if i in self.found]
        limited = len(self.found) >= self.limit and size > len(self.seen)
        return MorgueListing(records, size, len(self.seen), limited, frozenset(self.capped))

    def _full(self) -> bool:
        return len(self.found) >= self.limit or (
            self.wanted is not None and len(self.found) >= len(self.wanted)
        )

    def _take(self, batch: list[Message], group: str | None = None) -> tuple[int, int]:
        """Hold a received batch; returns (messages not seen before, messages of ``group``)."""
        new = of_group = 0
        for message in batch:
            of_group += message.group_id == group
            self.held[message.message_id] = message
            if message.message_id in self.seen:
                continue
            self.seen.add(message.message_id)
            new += 1
            self.groups.setdefault(message.group_id, []).append(message.message_id)
            record = read(message)
            matches = (self.entity is None or record.entity_id == self.entity) and (
                self.wanted is None or record.message_id in self.wanted
            )
            if matches and not self._full():
                self.found[message.message_id] = record
        return new, of_group

    def _sweep(self) -> None:
        """Receive until the morgue returns nothing (or nothing new: holds ran out)."""
        while not self._full() and len(self.seen) < MAX_SCAN:
            new, _ = self._take(self.morgue.receive())
            if not new:
                return

    def _follow_groups(self, size: int) -> None:
        """Release each entity's held jobs in turn and receive again: the queue then
        returns that entity's jobs from its oldest, the ones held back included."""
        for group in list(self.groups):
            if self._full() or len(self.seen) >= min(size, MAX_SCAN):
                return
            if self.entity is not None and group != self.entity:
                continue
            for _ in range(MAX_BATCH_ENTRIES):
                ids = [i for i in self.groups[group] if i in self.held]
                self.morgue.release([self.held.pop(i) for i in ids])
                new, of_group = self._take(self.morgue.receive(), group)
                if of_group >= MAX_BATCH_ENTRIES:
                    self.capped.add(group)
                if not new or of_group >= MAX_BATCH_ENTRIES or self._full():
                    break


def _send_chunks(
    items: list[tuple[Message, SendEntry]],
) -> Iterable[list[tuple[Message, SendEntry]]]:
    """Consecutive runs of at most 10 entries and 1 MiB: one SendMessageBatch each."""
    chunk: list[tuple[Message, SendEntry]] = []
    size = 0
    for message, item in items:
        length = len(item.body.encode("utf-8"))
        if chunk and (len(chunk) == MAX_BATCH_ENTRIES or size + length > MAX_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append((message, item))
        size += length
    if chunk:
        yield chunk


def read(message: Message) -> MorgueRecord:
    """A morgue message's record; one shardq cannot read shows up as what it is."""
    try:
        record = decode(message.body)
    except ValueError as exc:
        return unreadable(message, str(exc))
    if record.entity_id != message.group_id:
        return unreadable(
            message,
            f"it names entity {record.entity_id!r} but sits in group {message.group_id!r}",
        )
    return record


def payload_of(record: MorgueRecord, signing_key: bytes | None = None) -> Any:
    """The dead job's payload, or None if its body is not a valid envelope."""
    if record.reason == REASON_UNREADABLE or not record.body_kept:
        return None
    try:
        return envelope.decode(record.body, signing_key).payload
    except EnvelopeError:
        return None


__all__ = [
    "KIND",
    "MAX_SCAN",
    "REASON_INVALID",
    "REASON_MAX_RETRIES",
    "REASON_PERMANENT",
    "REASON_UNKNOWN_WORKER",
    "REASON_UNREADABLE",
    "VERSION",
    "MorgueListing",
    "MorgueQueue",
    "MorgueRecord",
    "decode",
    "encode",
    "entry",
    "payload_of",
    "read",
    "record_for",
    "requeue_problem",
]
