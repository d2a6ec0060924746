"""Publishing: validate every job first (nothing is sent if one is invalid), then send in
batches of up to 10 per shard queue. After a refused job, later jobs of its entity are not
sent; a later entry of the same batch SQS accepted anyway is listed in ``gaps``. Indexes are
the caller's items, whatever an ``around_publish`` did to the list; the jobs it made itself
follow them.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from shardq.broker.base import SendEntry, batches
from shardq.core import envelope
from shardq.core.clock import Clock, wall
from shardq.core.errors import (
    BrokerError,
    DedupIdError,
    PayloadError,
    PayloadTooLargeError,
    PublishError,
    QueueNotFoundError,
    ShardqError,
)
from shardq.core.jobs import Job, JobSpec
from shardq.core.layout import WorkerLayout, publish_to
from shardq.core.limits import MIN_MESSAGE_BYTES
from shardq.core.middleware import Middleware, PublishContext, run_around
from shardq.core.topology import check_entity_id, shard_for

if TYPE_CHECKING:
    from shardq.core.jobs import WorkerLike
    from shardq.store.deployment import Deployment


@dataclass
class PublishReport:
    """``message_ids[i]`` is the message id of item ``i``, None if it was not published;
    past the caller's ``items``, those of jobs an ``around_publish`` middleware made itself."""

    message_ids: list[str | None] = field(default_factory=list)
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    #: ``(index, entity_id)`` of jobs published after a refused job of their entity.
    gaps: list[tuple[int, str]] = field(default_factory=list)
    items: int = 0  #: how many items the caller gave

    @property
    def sent(self) -> int:
        return sum(1 for m in self.message_ids if m is not None)


@dataclass
class _Prepared:
    index: int
    item: int  # the caller's index (past the caller's items: a job a middleware made)
    entity_id: str
    queue: str
    entry: SendEntry
    size: int


class Publisher:
    """Publishes jobs of an app's workers (reached as ``Worker.publish``)."""

    def __init__(self, app: Deployment, wall_clock: Clock = wall) -> None:
        """``wall_clock``: Unix time, the sent time each job carries."""
        self._app, self._wall = app, wall_clock
        self._max_bytes: dict[str, int] = {}
        self._calls = itertools.count()  # marks a call's items, through with_meta and replace

    def publish_many(
        self, worker: type[WorkerLike] | str, items: Iterable[JobSpec]
    ) -> PublishReport:
        """Publish jobs of one worker; raises :class:`PublishError` if any was not sent."""
        name = self._app.worker(worker if isinstance(worker, str) else worker.__name__).__name__
        call, jobs = next(self._calls), [_as_job(i, item) for i, item in enumerate(items)]
        if self._app.middleware:  # it may change the list: each job carries its item
            jobs = [replace(job, _item=(call, i)) for i, job in enumerate(jobs)]
        ctx, count = PublishContext(name, jobs), len(jobs)  # ctx.jobs may change in place
        return run_around(
            self._app.middleware,
            "around_publish",
            lambda: self._publish(name, ctx.jobs, _items(ctx.jobs, call, count), count),
            ctx,
        )

    def publish(self, worker: type[WorkerLike] | str, job: Job) -> str:
        """Publish one job; returns its message id. Raises :class:`PublishError` if it was
        not sent, or if an ``around_publish`` middleware dropped it (there is no id)."""
        report = self.publish_many(worker, [job])
        if report.message_ids[0] is not None:  # publish_many raised if it was refused
            return report.message_ids[0]
        hooks = {type(m).__name__: type(m).around_publish for m in self._app.middleware}
        names = " or ".join(n for n, h in hooks.items() if h is not Middleware.around_publish)
        made = f"replaced it by {report.sent} jobs it made itself, published" if report.sent else ""
        raise PublishError(
            f"the around_publish of {names} dropped the job for entity {job.entity_id!r}"
            f"{' and ' + made if made else ': nothing was published'}: there is no message "
            "id to return (make jobs from the caller's with job.with_meta or dataclasses.replace)",
            failed=[(0, job.entity_id, f"dropped by {names}")],
            sent=report.sent,
        )

    def check(self, worker: type[WorkerLike] | str, job: Job) -> None:
        """Raise what :meth:`publish_many` would raise for this job (bad entity id,
        payload or dedup_id, message too large), without publishing it."""
        name = self._app.worker(worker if isinstance(worker, str) else worker.__name__).__name__
        self._prepare(0, 0, "", job, name, self._app.layouts.get(name))

    def _publish(self, name: str, jobs: list[Job], items: list[int], count: int) -> PublishReport:
        """Publish ``jobs`` (``items``: the caller's index of each) of ``count`` items."""
        layout = self._app.layouts.get(name)  # at most layout_refresh_seconds old
        report = PublishReport([None] * max([count, *[i + 1 for i in items]]), items=count)
        missing = self._send(name, jobs, items, range(len(jobs)), layout, report)
        while missing:  # a retired queue deleted after a reshard: publish with a fresh layout
            indexes = sorted(i for queued in missing.values() for i in queued)
            fresh = self._app.layouts.read(name)
            if publish_to(fresh)[0] == publish_to(layout)[0]:
                reason = f"its queue does not exist ({', '.join(missing)})"
                report.failed += [(items[i], jobs[i].entity_id, reason) for i in indexes]
                break
            layout = fresh
            missing = self._send(name, jobs, items, indexes, layout, report)
        if report.failed:
            first = report.failed[0]
            raise PublishError(
                f"{len(report.failed)} of {len(jobs)} {name} jobs were not published "
                f"(first: {_named(first[0], count)}, entity {first[1]!r}: {first[2]}); the "
                "others were. Publish the failed ones again with the same dedup_id",
                failed=report.failed,
                sent=report.sent,
                gaps=report.gaps,
            )
        return report

    def _send(
        self,
        worker: str,
        jobs: list[Job],
        items: list[int],
        indexes: Iterable[int],
        layout: WorkerLayout,
        report: PublishReport,
    ) -> dict[str, list[int]]:
        """Send the jobs at ``indexes`` by ``layout`` into ``report`` (all checked before
        any is sent); returns the indexes of those whose queue does not exist, by queue."""
        by_queue: dict[str, list[_Prepared]] = {}
        for index in indexes:
            item = items[index]  # name the item in a batch, or a job a middleware made
            where = f"{_named(item, report.items)}: " if len(report.message_ids) > 1 else ""
            prepared = self._prepare(index, item, where, jobs[index], worker, layout)
            by_queue.setdefault(prepared.queue, []).append(prepared)
        missing: dict[str, list[int]] = {}
        for queue, queued in by_queue.items():
            try:
                self._send_queue(queue, queued, report)
            except QueueNotFoundError:
                missing[queue] = [p.index for p in queued]
        return missing

    def _prepare(
        self, index: int, item: int, where: str, job: Job, worker: str, layout: WorkerLayout
    ) -> _Prepared:
        try:
            entity = check_entity_id(job.entity_id)
            if not isinstance(job.meta or {}, Mapping):
                raise PayloadError(
                    f"meta for entity {entity!r} of {worker} must be a mapping (a dict of "
                    f"names to JSON values), got {type(job.meta).__name__}"
                )
            body = envelope.encode(
                envelope.Envelope(worker, entity, job.payload, self._wall(), dict(job.meta or {})),
                self._app.signing_key,
            )
        except ShardqError as exc:
            if not where:
                raise
            raise type(exc)(f"{where}{exc}") from exc
        gen, shards = publish_to(layout)
        queue = self._app.shard_queue(worker, shard_for(entity, shards), gen)
        self._app.ensure_queue(queue, worker)
        size = len(body.encode("utf-8"))
        # every queue takes MIN_MESSAGE_BYTES: its own limit is read only for a larger job
        if size > MIN_MESSAGE_BYTES and queue not in self._max_bytes:
            self._max_bytes[queue] = self._app.broker.max_message_bytes(queue)
        if size > (limit := self._max_bytes.get(queue, MIN_MESSAGE_BYTES)):
            raise PayloadTooLargeError(
                f"{where}job for entity {entity!r} of {worker} encodes to {size} bytes; "
                f"queue {queue} accepts at most {limit}. Store large data elsewhere (e.g. S3) "
                "and publish a reference"
            )
        dedup = _dedup(where, entity, job.dedup_id)
        entry = SendEntry(str(index), body, entity, dedup)
        return _Prepared(index, item, entity, queue, entry, size)

    def _send_queue(self, queue: str, jobs: list[_Prepared], report: PublishReport) -> None:
        failed_entities: set[str] = set()
        for n, chunk in enumerate(batches(jobs, lambda job: job.size)):
            reason = "not sent: an earlier job of this entity was not published"
            report.failed += [
                (j.item, j.entity_id, reason) for j in chunk if j.entity_id in failed_entities
            ]
            sendable = [j for j in chunk if j.entity_id not in failed_entities]
            if not sendable:
                continue
            ids: dict[str, str] = {}
            try:
                result = self._app.broker.send_batch(queue, [j.entry for j in sendable])
                ids, reasons = result.message_ids, result.failed
            except QueueNotFoundError:
                if n == 0:  # nothing of this queue was sent: publish again
                    raise
                reasons = {j.entry.id: "its queue was deleted meanwhile" for j in sendable}
            except BrokerError as exc:
                reasons = {j.entry.id: str(exc) for j in sendable}
            for job in sendable:
                message_id = ids.get(job.entry.id)
                if message_id is None:
                    failed_entities.add(job.entity_id)
                    reason = reasons.get(job.entry.id, "not accepted by the broker")
                    report.failed.append((job.item, job.entity_id, reason))
                    continue
                report.message_ids[job.item] = message_id
                if job.entity_id in failed_entities:  # refused earlier in this batch
                    report.gaps.append((job.item, job.entity_id))


def _dedup(where: str, entity: str, dedup_id: object) -> str:
    if dedup_id is None:
        return uuid.uuid4().hex
    if not isinstance(dedup_id, str) or not dedup_id:
        raise DedupIdError(f"{where}dedup_id must be a non-empty string, got {dedup_id!r}")
    try:
        dedup_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DedupIdError(
            f"{where}dedup_id {dedup_id!r} is not valid Unicode ({exc.reason} at position "
            f"{exc.start}); use a string of whole characters"
        ) from None
    return hashlib.sha256(f"{entity}\0{dedup_id}".encode()).hexdigest()


def _items(jobs: list[Job], call: int, count: int) -> list[int]:
    """The caller's index of each job of ``publish_many`` call ``call`` (of ``count`` items);
    the jobs a middleware made itself follow them, unless it made every job anew, one for
    each item: those are taken to be the caller's, in the caller's order."""
    tags = [getattr(j, "_item", None) for j in jobs]  # an init-only value of Job
    mine = [t[1] if t is not None and t[0] == call else None for t in tags]
    if len(jobs) == count and all(i is None for i in mine):
        return list(range(count))
    made = itertools.count(count)
    return [next(made) if i is None else i for i in mine]


def _named(item: int, items: int) -> str:
    return f"item {item}" if item < items else "a job added by a middleware"


def _as_job(index: int, item: JobSpec) -> Job:
    if isinstance(item, Job):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        return Job(*item)
    raise TypeError(
        f"item {index}: expected shardq.Job(entity_id, payload, dedup_id, meta) or a tuple "
        f"(entity_id, payload[, dedup_id]), got {type(item).__name__}"
    )
