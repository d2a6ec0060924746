"""The morgue: dead jobs in the app's state store, one record per job (keys and values
in :mod:`shardq.morgue.record`). Nodes :func:`bury` a job before deleting it;
:class:`Morgue` lists, requeues (each entity's oldest first) and purges them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

import structlog

from shardq.broker.base import SendEntry, batches
from shardq.core import envelope
from shardq.core.clock import wall
from shardq.core.decide import REASON_INVALID as REASON_INVALID
from shardq.core.decide import REASON_MAX_RETRIES as REASON_MAX_RETRIES
from shardq.core.decide import REASON_PERMANENT as REASON_PERMANENT
from shardq.core.decide import REASON_UNKNOWN_WORKER as REASON_UNKNOWN_WORKER
from shardq.core.decide import REASON_UNREADABLE as REASON_UNREADABLE
from shardq.core.errors import BrokerError, EnvelopeError, UnknownWorkerError
from shardq.core.layout import publish_to
from shardq.core.tables import utc
from shardq.core.topology import shard_for
from shardq.morgue.record import MorgueRecord as MorgueRecord
from shardq.morgue.record import bury as bury
from shardq.morgue.record import (
    entity_key,
    id_key,
    keys_of,
    stamp_for,
    summary,
    unreadable,
    whole,
    written,
)
from shardq.morgue.record import record_for as record_for
from shardq.morgue.record import requeue_problem as requeue_problem
from shardq.store.base import MAX_QUERY_ITEMS, DamagedItem
from shardq.store.base import StoreError as StoreError

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.morgue")

ROUND = 100  # dead jobs a requeue sends (and deletes) per round
#: Dead jobs a view counts at most (one page): a count reads every summary it counts,
#: and stats and the dashboard count at every refresh.
COUNTED = MAX_QUERY_ITEMS

Progress = Callable[[int], None]
Refused = Callable[[MorgueRecord, str], None]  # a dead job a requeue leaves, and why


@dataclass(frozen=True)
class Filter:
    """Which dead jobs: all of them, or those matching every filter given."""

    entity: str | None = None
    error_type: str | None = None
    since: float | None = None  # died at or after (unix seconds)
    until: float | None = None  # died at or before
    message_ids: frozenset[str] | None = None

    def matches(self, record: MorgueRecord, unknown: bool = False) -> bool:
        """Does the record match? One shardq cannot read matches an error type or time
        only if ``unknown`` (its key's stamp in range): what it died of, and when, is not
        known, so a requeue stops at it but a purge must not delete it."""
        known = record.reason != REASON_UNREADABLE
        if not (known or unknown) and (self.error_type, self.since, self.until) != (None,) * 3:
            return False
        return (
            (self.entity is None or record.entity_id == self.entity)
            and (self.error_type is None or not known or record.error_type == self.error_type)
            and (self.since is None or not known or record.failed_at >= self.since)
            and (self.until is None or not known or record.failed_at <= self.until)
            and (self.message_ids is None or not self.message_ids.isdisjoint(_ids(record)))
        )

    def describe(self) -> str:
        """`` of entity order-42 with error type KeyError that died since 2026-…``, or ``""``."""
        since, until = self.since, self.until
        died = "" if since is None else f" that died since {_utc(since)}"
        if until is not None and since is not None:
            died = f" that died between {_utc(since)} and {_utc(until)}"
        elif until is not None:
            died = f" that died before {_utc(until)}"
        parts = [
            f" of entity {self.entity}" if self.entity is not None else "",
            f" with error type {self.error_type}" if self.error_type is not None else "",
            died,
            f" with ids {', '.join(sorted(self.message_ids))}" if self.message_ids else "",
        ]
        return "".join(parts)


@dataclass(frozen=True)
class Page:
    """Dead jobs in death order, and the cursor of the next page (None: no more)."""

    records: list[MorgueRecord]
    next: str | None


NOT_REGISTERED = (
    "no worker named {!r} is registered: its dead jobs can be listed and purged, not "
    "requeued; register the worker class again to requeue them"
)


class Morgue:
    """One worker's dead jobs: list, requeue, purge, expire."""

    def __init__(self, app: Deployment, worker: str) -> None:
        self.app = app
        self.store = app.store
        self.registered = True
        try:
            self.worker = app.worker(worker).__name__
        except UnknownWorkerError:  # a worker removed from the code keeps its dead jobs
            dead = f"morgue/{worker}/t/"
            if not worker.isidentifier() or not self.store.query(dead, limit=1, keep_damaged=True):
                raise
            self.worker, self.registered = worker, False

    def size(self, exact: bool = False) -> int:
        """How many dead jobs the worker has (damaged ones too); :data:`COUNTED` if it has
        that many or more, unless ``exact`` (every summary read)."""
        dead = f"morgue/{self.worker}/t/"
        if exact:
            return len(self.store.query_all(dead, keep_damaged=True))
        return len(self.store.query(dead, limit=COUNTED, keep_damaged=True))

    def page(self, where: Filter = Filter(), limit: int = 100, after: str | None = None) -> Page:
        """At most ``limit`` matching dead jobs after the cursor ``after``, loaded whole."""
        scan = self._scan(where, after, size=min(limit + 1, MAX_QUERY_ITEMS))
        found = list(islice(scan, limit))
        more = found and next(scan, None) is not None
        return Page([self.load(r) for _, r in found], found[-1][0] if more else None)

    def list_jobs(self, entity: str | None = None, limit: int = 100) -> list[MorgueRecord]:
        """The first ``limit`` dead jobs (of ``entity``), in death order."""
        return self.page(Filter(entity=entity), limit).records

    def load(self, record: MorgueRecord) -> MorgueRecord:
        """The whole record (traceback, meta, body) of a listed one, with the id it is listed
        (and selected) by; one with an item that cannot be read is unreadable."""
        try:
            item = self.store.get(record.key)
            if item is None:
                return record  # purged meanwhile, or only its summary is left
            first = whole(item, [])
            parts = [self.store.get(key) for key in keys_of(record.key, first.pieces)[2:]]
        except DamagedItem as exc:
            return unreadable(str(exc), record.entity_id, record.message_id, key=record.key)
        bodies = [None if p is None else p.value.get("body") for p in parts]
        found = whole(item, [b if isinstance(b, str) else "" for b in bodies]) if parts else first
        return replace(found, message_id=record.message_id)

    def requeue(
        self,
        where: Filter = Filter(),
        progress: Progress | None = None,
        refused: Refused | None = None,
        seen: set[str] | None = None,
    ) -> int:
        """Send matching dead jobs back to their shard, each entity's oldest first, then
        delete their records; how many. One that cannot be requeued stays and is passed
        to ``refused``, as are its entity's later matches (they must not overtake it).
        ``seen`` gets the ids (message id, record key) of every match. A record found by
        its entity without a summary is left alone: a burial under way or cut short (its
        job is still in its queue) or a purge cut short; a job is dead once summed up."""
        if not self.registered:
            raise UnknownWorkerError(NOT_REGISTERED.format(self.worker))
        done, stopped = 0, set[str]()
        scan = (record for _, record in self._scan(where, seen=seen, summed=True))
        while batch := list(islice(scan, ROUND)):
            sendable = []
            for record in map(self.load, batch):
                problem = requeue_problem(record)
                if problem is None and record.entity_id in stopped:
                    problem = "an earlier dead job of its entity was not requeued"
                if problem is None:
                    sendable.append(record)
                    continue
                stopped.add(record.entity_id)
                if refused is not None:
                    refused(record, problem)
            failed = set[str]()  # not the entities stopped after their sendable records
            done = self._delete(self._resend(sendable, failed, refused), progress, done)
            stopped |= failed
        return done

    def purge(
        self,
        where: Filter = Filter(),
        progress: Progress | None = None,
        seen: set[str] | None = None,
    ) -> int:
        """Delete matching dead jobs for good; how many. ``seen`` as for :meth:`requeue`."""
        scan = self._scan(where, seen=seen, unknown=False)
        return self._delete((record for _, record in scan), progress)

    def expire(self, days: float, now: float | None = None) -> int:
        """Delete the dead jobs that died more than ``days`` ago."""
        cutoff = (wall() if now is None else now) - days * 86400
        old = self._scan(Filter(until=cutoff))  # unreadable ones too, by their key's stamp
        return self._delete((record for _, record in old), None)

    def _scan(
        self,
        where: Filter,
        after: str | None = None,
        seen: set[str] | None = None,
        unknown: bool = True,
        size: int = MAX_QUERY_ITEMS,
        summed: bool = False,
    ) -> Iterator[tuple[str, MorgueRecord]]:
        """(cursor, summary) of every match in death order, read page by page (the first
        of ``size`` items: a listing's); ``seen`` gets each match's ids; ``unknown`` as for
        :meth:`Filter.matches`; ``summed``: only records whose summary is written (one
        read more per record found by its entity)."""
        part = "t/" if where.entity is None else f"e/{entity_key(where.entity)}/"
        base = f"morgue/{self.worker}/{part}"
        start = None if after is None else base + after
        if where.since is not None:
            start = max(start or "", base + stamp_for(where.since))
        end = None if where.until is None else stamp_for(where.until + 1e-9)
        while True:
            got = self.store.query(base, start_after=start, limit=size, keep_damaged=True)
            for item in got:
                at = item.key[len(base) :]
                if end is not None and at[: len(end)] >= end:
                    return
                record = summary(item)
                if record.reason == REASON_UNREADABLE:
                    record = self._other(item.key, record)
                if where.matches(record, unknown) and (
                    not summed or part == "t/" or written(self.store, keys_of(item.key, 1)[0])
                ):
                    if seen is not None:
                        seen.update(_ids(record))
                    yield at, record
            if len(got) < size:
                return
            start, size = got[-1].key, MAX_QUERY_ITEMS

    def _other(self, key: str, record: MorgueRecord) -> MorgueRecord:
        """The summary of a record whose item at ``key`` cannot be read, from its other
        item (its record for a summary, its summary for a record) if that one can be."""
        t, e = keys_of(key, 1)
        try:
            other = self.store.get(e if key == t else t)
        except DamagedItem:
            return record
        found = record if other is None else summary(other)
        return record if found.reason == REASON_UNREADABLE else found

    def _delete(
        self, records: Iterable[MorgueRecord], progress: Progress | None, done: int = 0
    ) -> int:
        """Delete each record's items (summary first: it leaves listings at once), telling
        ``progress`` the count so far (from ``done``)."""
        for record in records:
            keys = [*keys_of(record.key, record.pieces), *self._id_of(record)]
            if record.reason == REASON_UNREADABLE:  # how many pieces its body has is not known
                pieces = keys_of(record.key, 2)[2].removesuffix("001")
                keys += [i.key for i in self.store.query_all(pieces, keep_damaged=True)]
            for key in dict.fromkeys(keys):
                self.store.delete(key)
            done += 1
            if progress is not None:
                progress(done)
        return done

    def _id_of(self, record: MorgueRecord) -> list[str]:
        """The id item of ``record``'s job if it names this record (a job recorded twice by
        an earlier version keeps the other's)."""
        key = id_key(self.worker, record.message_id)
        with suppress(DamagedItem):
            item = self.store.get(key)
            if item is None or item.value.get("summary") != keys_of(record.key, 1)[0]:
                return []
        return [key]  # (a damaged one too: it names nothing readable)

    def _resend(
        self, records: list[MorgueRecord], stopped: set[str], refused: Refused | None
    ) -> Iterator[MorgueRecord]:
        """Send to the live layout's shards; yields what was sent, one batch at a time, so
        each batch's records are deleted before the next is sent. A job not sent stays and
        stops its entity (its later dead jobs stay too); one SQS accepted is always yielded,
        even after a refused one of its batch: keeping its record would send it twice."""
        by_queue: dict[str, list[MorgueRecord]] = {}
        gen, shards = publish_to(self.app.layouts.get(self.worker))
        for record in records:
            queue = self.app.shard_queue(self.worker, shard_for(record.entity_id, shards), gen)
            by_queue.setdefault(queue, []).append(record)
        for queue, queued in by_queue.items():
            self.app.ensure_queue(queue, self.worker)
            for chunk in batches(queued, lambda record: record.body_bytes):
                if refused is not None:
                    for record in (r for r in chunk if r.entity_id in stopped):
                        refused(record, "an earlier dead job of its entity was not requeued")
                chunk = [r for r in chunk if r.entity_id not in stopped]
                entries = [
                    SendEntry(str(i), r.body, r.entity_id, _dedup(r)) for i, r in enumerate(chunk)
                ]
                try:
                    result = self.app.broker.send_batch(queue, entries)
                    accepted, failed = set(result.message_ids), result.failed
                except BrokerError as exc:
                    accepted, failed = set(), {e.id: str(exc) for e in entries}
                for record, entry in zip(chunk, entries, strict=True):
                    if entry.id in accepted:
                        if record.entity_id in stopped:
                            log.warning(
                                "morgue.requeued_out_of_order",
                                worker=self.worker,
                                entity=record.entity_id,
                                message_id=record.message_id,
                                detail="sent although an earlier job of its entity was not",
                            )
                        yield record
                        continue
                    stopped.add(record.entity_id)
                    if refused is not None:
                        why = failed.get(entry.id, "the broker did not accept it")
                        refused(record, f"not sent: {why}")


def _ids(record: MorgueRecord) -> tuple[str, str]:
    """The ids a dead job is selected by: its message id, and its record's key (the id
    one is listed with when neither of its items can be read)."""
    return record.message_id, record.key


def payload_of(record: MorgueRecord, signing_key: bytes | None = None) -> Any:
    """The dead job's payload, or None if its body is not a valid envelope."""
    if requeue_problem(record) is not None:  # unreadable, or no body kept
        return None
    try:
        return envelope.decode(record.body, signing_key).payload
    except EnvelopeError:
        return None


def _dedup(record: MorgueRecord) -> str:
    """The deduplication id of a requeue of ``record``: the same each time, so a requeue
    run again within SQS's 5 minutes (an answer lost, a stop) does not queue it twice."""
    return "requeue-" + hashlib.blake2b(record.key.encode(), digest_size=16).hexdigest()


def counted(size: int) -> str:
    """A :meth:`Morgue.size` as views print it: ``1000+`` for :data:`COUNTED`."""
    return f"{size}+" if size >= COUNTED else str(size)


def _utc(at: float) -> str:
    return f"{utc(at)} UTC"
