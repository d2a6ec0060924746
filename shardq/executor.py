"""Running one received batch of a shard, entity by entity, without breaking order.

For each entity in the batch, in receive order, its jobs run in chunks of up to
``batch_size`` (one ``perform`` call per chunk):

* success: the chunk's messages are deleted (batched at the end of the batch);
* failure with retries left: the chunk's messages become visible again after the
  retry delay (``Retry`` or ``retry_in``), and every later job of the entity in the
  batch is **not run and released** (visibility 0). The entity's group stays blocked
  by the failed job, so nothing overtakes it and nothing waits out a timeout;
* failure with no retries left, or a permanent error: the chunk goes to the
  worker's morgue, is then deleted, and the entity's next jobs run;
* a body that is not a valid envelope, or names another worker: morgue at once;
* a chunk whose message visibility lapsed before it started (the heartbeat could not
  extend it, e.g. while the broker was unreachable) is not run: another node may
  have received it. It and the entity's later jobs in the batch are left to the
  broker (the later ones released), to be delivered again in order.

Jobs of other entities in the batch are not affected. ``perform`` of one chunk is
all or nothing: its jobs retry, and reach the morgue, together.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from shardq import envelope, morgue
from shardq.broker.base import BatchResult, Message, batches
from shardq.errors import BrokerError, EnvelopeError, Retry, UnknownWorkerError
from shardq.heartbeat import Heartbeat, TimeLimitExceeded
from shardq.limits import MAX_VISIBILITY_SECONDS
from shardq.middleware import PerformContext, run_around
from shardq.plan import ShardRef
from shardq.worker import Worker, WorkerSettings

if TYPE_CHECKING:
    from shardq.app import App

log = structlog.get_logger("shardq.job")
_FLUSH_TRIES = 3


@dataclass(frozen=True)
class Outcome:
    """What became of one ``perform`` call's jobs (or of one invalid message)."""

    kind: str  # "succeeded", "retried" or "morgued"
    worker: str
    shard: int
    entity: str
    messages: list[Message]
    payloads: list[Any]
    duration: float
    error: BaseException | None = None


class Observer(Protocol):
    """Told of every outcome and broker error: the node's tally, its metrics, the
    test helpers."""

    def job_outcome(self, outcome: Outcome) -> None: ...

    def broker_error(self, operation: str) -> None: ...


@dataclass
class Tally:
    """Job outcomes counted by a node, per worker."""

    succeeded: dict[str, int] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    morgued: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, worker: str, n: int = 1) -> None:
        counter: dict[str, int] = getattr(self, kind)
        counter[worker] = counter.get(worker, 0) + n

    def job_outcome(self, outcome: Outcome) -> None:
        self.add(outcome.kind, outcome.worker, len(outcome.messages))

    def broker_error(self, operation: str) -> None:
        """Broker errors are logged; a tally does not count them."""


@dataclass
class _Job:
    message: Message
    payload: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Settle:
    """What to tell the broker once the batch is done."""

    delete: list[Message] = field(default_factory=list)
    hide: list[tuple[Message, float]] = field(default_factory=list)


class Executor:
    """Runs batches for one node thread. Not shared between threads."""

    def __init__(
        self,
        app: App,
        heartbeat: Heartbeat,
        stopping: threading.Event,
        observers: Sequence[Observer] = (),
        max_retry_delay: float | None = None,
    ) -> None:
        self._app = app
        self._broker = app.broker
        self._heartbeat = heartbeat
        self._stopping = stopping
        self._observers = list(observers)
        self._max_retry_delay = max_retry_delay
        self._workers: dict[str, Worker] = {}
        # receives of a message that ended in a release without running it, so the
        # attempt number is not inflated by this node's own releases
        self._unstarted: dict[str, int] = {}
        self._key = app.signing_key

    def run_batch(self, ref: ShardRef, messages: list[Message]) -> None:
        """Run a received batch of shard ``ref`` and settle every message."""
        settle = _Settle()
        settings = self._app.settings(ref.worker)
        worker = self._worker(ref.worker)
        for entity, group in _by_entity(messages):
            self._run_entity(ref, settings, worker, entity, group, settle)
        self._settle(ref.worker, messages[0].queue, settle)

    # -- one entity ----------------------------------------------------------------
    def _run_entity(
        self,
        ref: ShardRef,
        settings: WorkerSettings,
        worker: Worker,
        entity: str,
        messages: list[Message],
        settle: _Settle,
    ) -> None:
        jobs = [job for m in messages if (job := self._decode(ref, m, settle)) is not None]
        chunks = [
            jobs[i : i + settings.batch_size] for i in range(0, len(jobs), settings.batch_size)
        ]
        for index, chunk in enumerate(chunks):
            if self._stopping.is_set():  # shutting down: release what has not started
                self._release([j for c in chunks[index:] for j in c], settle)
                return
            if self._heartbeat.lapsed(j.message.receipt for j in chunk):
                self._give_up(ref, [j for c in chunks[index:] for j in c], settle)
                return
            started = time.monotonic()
            error = self._perform(worker, settings, entity, chunk)
            duration = round(time.monotonic() - started, 6)
            if error is None:
                settle.delete += [j.message for j in chunk]
                self._outcome("succeeded", ref, chunk, duration)
                continue
            attempt = self._attempt(chunk[0].message)
            permanent = isinstance(error, type(worker).permanent_errors)
            if permanent or attempt > settings.max_retries:
                reason = morgue.REASON_PERMANENT if permanent else morgue.REASON_MAX_RETRIES
                if self._bury(ref, worker, entity, chunk, reason, error, attempt, settle):
                    self._outcome("morgued", ref, chunk, duration, error=error, reason=reason)
                    continue
                delay = min(60.0, 2.0**attempt)  # the morgue is unreachable: try again later
            else:
                delay = self._retry_delay(worker, error, attempt)
                if self._max_retry_delay is not None:
                    delay = min(delay, self._max_retry_delay)
                self._outcome("retried", ref, chunk, duration, error=error, delay=delay)
            settle.hide += [(j.message, _cap(j.message, delay)) for j in chunk]
            self._release([j for c in chunks[index + 1 :] for j in c], settle)
            return

    def _decode(self, ref: ShardRef, message: Message, settle: _Settle) -> _Job | None:
        reason = morgue.REASON_INVALID
        try:
            env = envelope.decode(message.body, self._key)
            if env.worker != ref.worker:
                known = env.worker in self._app.workers
                reason = morgue.REASON_INVALID if known else morgue.REASON_UNKNOWN_WORKER
                raise UnknownWorkerError(
                    f"message names worker {env.worker!r} but sits in a queue of {ref.worker}"
                    + ("" if known else f"; no worker {env.worker!r} is registered")
                )
        except (EnvelopeError, UnknownWorkerError) as exc:
            attempt = self._attempt(message)
            job = _Job(message, None)
            if self._bury(ref, None, message.group_id, [job], reason, exc, attempt, settle):
                self._outcome("morgued", ref, [job], 0.0, error=exc, reason=reason)
            else:
                settle.hide.append((message, _cap(message, 30.0)))
            return None
        return _Job(message, env.payload, env.meta)

    def _perform(
        self, worker: Worker, settings: WorkerSettings, entity: str, chunk: list[_Job]
    ) -> BaseException | None:
        payloads = [j.payload for j in chunk]

        def call() -> None:
            worker.perform(entity, payloads)

        if self._app.middleware:
            ctx = PerformContext(
                settings.name,
                entity,
                payloads,
                self._attempt(chunk[0].message),
                [j.message.message_id for j in chunk],
                [j.meta for j in chunk],
            )
            perform = call

            def call() -> None:
                run_around(self._app.middleware, "around_perform", perform, ctx)

        try:
            _, overran = self._heartbeat.run_limited(call, settings.time_limit)
        except Exception as exc:
            return exc
        if overran:
            return TimeLimitExceeded(f"perform ran longer than {settings.time_limit} s")
        return None

    def _attempt(self, message: Message) -> int:
        return max(1, message.receive_count - self._unstarted.get(message.message_id, 0))

    def _retry_delay(self, worker: Worker, error: BaseException, attempt: int) -> float:
        if isinstance(error, Retry):
            if error.at is not None:
                at = error.at
                if isinstance(at, dt.datetime):
                    at = at.timestamp()
                return max(0.0, float(at) - time.time())
            if error.delay is not None:
                return max(0.0, float(error.delay))
        try:
            return max(0.0, float(worker.retry_in(attempt)))
        except Exception:
            log.exception("job.retry_in_failed", worker=type(worker).__name__, attempt=attempt)
            return min(60.0, 2.0**attempt)

    def _release(self, jobs: list[_Job], settle: _Settle) -> None:
        for job in jobs:
            settle.hide.append((job.message, 0.0))
            key = job.message.message_id
            self._unstarted[key] = self._unstarted.get(key, 0) + 1
        if len(self._unstarted) > 100_000:  # ids of jobs another node finished
            self._unstarted.clear()

    def _give_up(self, ref: ShardRef, jobs: list[_Job], settle: _Settle) -> None:
        """Run none of these jobs: the first one's message lapsed (see the module doc)."""
        lapsed = [j for j in jobs if self._heartbeat.lapsed([j.message.receipt])]
        gone = {j.message.receipt for j in lapsed}
        self._heartbeat.drop(gone)
        for job in lapsed:
            log.warning(
                "job.lapsed",
                worker=ref.worker,
                shard=ref.shard,
                entity=job.message.group_id,
                message_id=job.message.message_id,
                detail="its visibility ran out before it started; not run here, it is "
                "delivered again",
            )
        self._release([j for j in jobs if j.message.receipt not in gone], settle)

    def _bury(
        self,
        ref: ShardRef,
        worker: Worker | None,
        entity: str,
        chunk: list[_Job],
        reason: str,
        error: BaseException,
        attempt: int,
        settle: _Settle,
    ) -> bool:
        """Write the chunk to the morgue; only then is it deleted. False if that failed."""
        queue = self._app.morgue_queue(ref.worker)
        try:
            self._app.ensure_queue(queue, ref.worker)
            limit = self._broker.max_message_bytes(queue)
            for job in chunk:
                record = morgue.record_for(job.message, reason, error, attempt)
                result = self._broker.send_batch(queue, [morgue.entry(record, limit)])
                if result.failed:
                    raise BrokerError(result.failed["0"])
        except BrokerError as exc:
            log.error("job.morgue_failed", worker=ref.worker, entity=entity, error=str(exc))
            self._broker_error("morgue")
            return False
        settle.delete += [j.message for j in chunk]
        if worker is not None:
            try:
                worker.retries_exhausted(entity, [j.payload for j in chunk], error)
            except Exception:
                log.exception("hook.retries_exhausted_failed", worker=ref.worker, entity=entity)
        return True

    # -- settling ---------------------------------------------------------------
    def _settle(self, worker: str, queue: str, settle: _Settle) -> None:
        self._heartbeat.drop([m.receipt for m in settle.delete])
        self._heartbeat.drop([m.receipt for m, _ in settle.hide])
        for chunk in batches(settle.delete):
            receipts = [m.receipt for m in chunk]
            failed = self._retrying(partial(self._broker.delete_batch, queue, receipts), receipts)
            for m in chunk:
                self._unstarted.pop(m.message_id, None)
                if m.receipt in failed:
                    log.warning(
                        "job.delete_failed",
                        worker=worker,
                        queue=queue,
                        entity=m.group_id,
                        message_id=m.message_id,
                        reason=failed[m.receipt],
                        detail="the job ran but its message may be delivered again",
                    )
        for hidden in batches(settle.hide):
            changes = [(m.receipt, s) for m, s in hidden]
            call = partial(self._broker.change_visibility_batch, queue, changes)
            self._retrying(call, [r for r, _ in changes])

    def _retrying(self, call: Callable[[], BatchResult], receipts: list[str]) -> dict[str, str]:
        """Failed receipts of a settle call, retried while the broker is unreachable."""
        for attempt in range(_FLUSH_TRIES):
            try:
                return call().failed
            except BrokerError as exc:
                log.warning("broker.settle_failed", attempt=attempt + 1, error=str(exc))
                self._broker_error("settle")
                time.sleep(0.5 * 2**attempt)
        return dict.fromkeys(receipts, "broker unreachable")

    def _outcome(
        self, kind: str, ref: ShardRef, chunk: list[_Job], duration: float, **extra: Any
    ) -> None:
        error = extra.pop("error", None)
        if error is not None:
            extra["error"] = f"{type(error).__name__}: {error}"
        expected = kind == "succeeded" or isinstance(error, Retry)  # Retry is asked for
        level = log.info if expected else log.warning
        for job in chunk:
            level(
                f"job.{kind}",
                worker=ref.worker,
                shard=ref.shard,
                entity=job.message.group_id,
                message_id=job.message.message_id,
                attempt=self._attempt(job.message),
                duration=duration,
                **extra,
            )
        outcome = Outcome(
            kind,
            ref.worker,
            ref.shard,
            chunk[0].message.group_id,
            [j.message for j in chunk],
            [j.payload for j in chunk],
            duration,
            error,
        )
        for observer in self._observers:
            try:
                observer.job_outcome(outcome)
            except Exception:
                log.exception("observer.failed", observer=type(observer).__name__)

    def _broker_error(self, operation: str) -> None:
        for observer in self._observers:
            observer.broker_error(operation)

    def _worker(self, name: str) -> Worker:
        worker = self._workers.get(name)
        if worker is None:
            worker = self._workers[name] = self._app.worker(name)()
        return worker


def _cap(message: Message, delay: float) -> float:
    """A visibility change may reach at most 12 h after the receive."""
    room = message.received_at + MAX_VISIBILITY_SECONDS - time.time() - 1
    return max(0.0, min(delay, room))


def _by_entity(messages: list[Message]) -> Iterator[tuple[str, list[Message]]]:
    groups: dict[str, list[Message]] = {}
    for m in messages:
        groups.setdefault(m.group_id, []).append(m)
    return iter(groups.items())
