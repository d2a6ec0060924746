"""Running one received batch of a shard, entity by entity, in chunks of up to
``batch_size``, without breaking order (docs/design/run.md, "Order and exclusion").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import TYPE_CHECKING, Any

import structlog

from shardq import morgue
from shardq.broker.base import Message
from shardq.core import envelope
from shardq.core import layout as layouts
from shardq.core.attempts import Attempts
from shardq.core.clock import Clock, monotonic, wall
from shardq.core.decide import MORGUE, RETRY, Decision, Rules, backoff, decide
from shardq.core.errors import BrokerError, EnvelopeError, UnknownWorkerError
from shardq.core.jobs import JobInfo, WorkerLike, WorkerSettings
from shardq.core.outcome import (
    DONE,
    GAVE_UP,
    HIDDEN,
    LATER,
    MORGUED,
    RETRIED,
    STOPPED,
    SUCCEEDED,
    Deferred,
    EntityEnd,
    Observer,
    Reporter,
)
from shardq.core.outcome import Outcome as Outcome
from shardq.core.plan import ShardRef
from shardq.publish.relay import relay, unrelayable
from shardq.run.aio import Performer
from shardq.run.leases import Leases
from shardq.run.shard import by_entity
from shardq.run.timelimit import TimeLimits
from shardq.store.base import DamagedItem

if TYPE_CHECKING:
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.job")

#: Retries due within this many seconds are held by the lane, not hidden at the broker.
LOCAL_RETRY_SECONDS = 10.0
#: When an invalid message could not be written to the morgue: try again after this.
INVALID_RETRY_SECONDS = 30.0
#: A job held back by a reshard, or whose relay failed, is looked at again after this.
GATE_SECONDS = 1.0

#: Decides what to do with an entity's jobs from a shard: run, wait or relay.
Router = Callable[[ShardRef, str], str]


@dataclass
class _Job:
    message: Message
    payload: Any
    meta: dict[str, Any] = field(default_factory=dict)
    #: Set for a message that is not a valid job (it goes to the morgue in its turn).
    invalid: BaseException | None = None
    reason: str = ""


class Executor:
    """Runs entities' jobs for a node (any thread; each has its own worker instances).
    Retries are due on :attr:`clock`; ``Retry(at=...)`` is read on ``wall_clock``."""

    def __init__(
        self,
        app: Deployment,
        leases: Leases,
        limits: TimeLimits,
        stopping: threading.Event,
        observers: Sequence[Observer] = (),
        max_retry_delay: float | None = None,
        router: Router | None = None,
        clock: Clock = monotonic,
        wall_clock: Clock = wall,
    ) -> None:
        self._app = app
        self._router = router or (
            lambda ref, e: layouts.route(app.layouts.cached(ref.worker), ref.gen, ref.shard, e)
        )
        self._leases, self._stopping = leases, stopping
        self.clock, self._wall = clock, wall_clock
        self._report = Reporter(observers, clock)
        self._max_delay = max_retry_delay
        self._local_workers = threading.local()
        self.perform = Performer(limits, app.middleware, clock)
        self._attempts = Attempts()
        self.attempt = self._attempts.of
        self._key = app.signing_key

    def run_batch(self, ref: ShardRef, messages: list[Message]) -> list[Deferred]:
        """Run a received batch of shard ``ref`` entity by entity; returns the retries
        held here."""
        ends = self.run_entities(ref, by_entity(messages), self._stopping.is_set)
        return [Deferred(end.due, ref, end.messages) for end in ends if end.kind == LATER]

    def run_entity(
        self, ref: ShardRef, messages: list[Message], stop: Callable[[], bool]
    ) -> EntityEnd:
        """Run one entity's jobs of shard ``ref`` in order; ``stop`` is asked before each
        ``perform`` call."""
        settings, worker = self._app.settings(ref.worker), self._worker(ref.worker)
        return self._run_entity(ref, settings, worker, messages, stop)

    def run_entities(
        self, ref: ShardRef, groups: list[list[Message]], stop: Callable[[], bool]
    ) -> Iterator[EntityEnd]:
        """:meth:`run_entity` for each entity's jobs of a batch in turn (one settings and
        worker look-up); the jobs that succeeded are deleted together at the end."""
        settings, worker = self._app.settings(ref.worker), self._worker(ref.worker)
        done: list[Message] = []
        try:
            for messages in groups:
                yield self._run_entity(ref, settings, worker, messages, stop, done)
        finally:
            if done:
                self._leases.delete(done)

    def delete(self, messages: list[Message]) -> None:
        """Copies of jobs that ran to an end here, delivered again meanwhile."""
        self._leases.delete(messages)

    def hide(self, messages: list[Message], seconds: float) -> None:
        """Held jobs hidden for ``seconds`` (a retry's delay left; 0: visible again now)."""
        self._leases.hide(messages, seconds)

    def hide_later(self, messages: list[Message], seconds: float) -> None:
        """Jobs that joined an entity after its failed job was hidden: hidden with it
        (they did not start, so their next receive is not an attempt)."""
        self._attempts.unstarted(messages)
        self._leases.hide(messages, seconds)

    def give_up_later(self, messages: list[Message]) -> None:
        """Jobs that joined an entity whose earlier job lapsed: not run here either."""
        self._attempts.unstarted(messages)
        self._leases.forget(messages)

    # -- one entity ----------------------------------------------------------------
    def _run_entity(
        self,
        ref: ShardRef,
        settings: WorkerSettings,
        worker: WorkerLike,
        messages: list[Message],
        stop: Callable[[], bool],
        done: list[Message] | None = None,
    ) -> EntityEnd:
        jobs = [self._decode(ref, m) for m in messages]
        action = self._router(ref, messages[0].group_id)
        if action == layouts.RELAY and not self._relayed(ref, jobs):
            action = layouts.WAIT
        if action == layouts.WAIT:  # held, in order, without counting an attempt
            return self._retry([], jobs, GATE_SECONDS)
        if action == layouts.RELAY:
            return EntityEnd(DONE)
        i, isolate_until, performed = 0, 0, 0.0
        may_start, attempt_of = self._leases.may_start, self.attempt
        while i < len(jobs):
            if stop():  # shutting down or handed over: the node releases what has not run
                return EntityEnd(STOPPED, [j.message for j in jobs[i:]])
            chunk = self._chunk(jobs, i, 1 if i < isolate_until else settings.batch_size)
            payloads: list[Any] = []
            infos: list[JobInfo] = []
            for j in chunk:  # one pass: may it start, its payload, its job info
                m = j.message
                if not may_start(m):
                    self._give_up(ref, jobs[i:])  # lapsed, or no longer held here
                    return EntityEnd(GAVE_UP, [j.message for j in jobs[i:]])
                payloads.append(j.payload)
                infos.append(JobInfo(m.message_id, attempt_of(m), m.sent_at, j.meta))
            invalid = chunk[0].invalid
            if invalid is not None:  # its turn: the morgue, or wait with the rest
                if self._bury(ref, None, chunk, chunk[0].reason, invalid, 0.0):
                    i += 1
                    continue
                return self._retry(chunk, jobs[i + 1 :], INVALID_RETRY_SECONDS)
            error, duration = self.perform(worker, settings, messages[0].group_id, payloads, infos)
            performed += duration
            if error is None:
                self._succeeded(ref, chunk, duration, done)
                i += len(chunk)
                continue
            attempt = self.attempt(chunk[0].message)
            errors = type(worker).permanent_errors
            rules = Rules(settings.max_retries, errors, worker.retry_in, self._max_delay)
            decision = decide(error, attempt, rules, self._wall())
            if decision.action == MORGUE and len(chunk) > 1:
                isolate_until = i + len(chunk)  # run them again one at a time
                continue
            if decision.action == MORGUE:
                if self._bury(ref, worker, chunk, decision.reason, error, duration):
                    i += len(chunk)
                    continue
                decision = Decision(RETRY, delay=backoff(attempt))  # morgue unreachable
            if decision.retry_in_failed:
                log.error(
                    "job.retry_in_failed", worker=ref.worker, detail="used the default backoff"
                )
            self._outcome(RETRIED, ref, chunk, duration, error, delay=round(decision.delay, 3))
            return self._retry(chunk, jobs[i + len(chunk) :], decision.delay)
        return EntityEnd(DONE, performed=performed)

    def _relayed(self, ref: ShardRef, jobs: list[_Job]) -> bool:
        """Send an entity's jobs on to the current layout, then delete them here; those
        refused for good go to the morgue as invalid (or are hidden to try again)."""
        messages = [j.message for j in jobs]
        if any(self._leases.lapsed(m) for m in messages):
            return False  # another node may have them now; the next look gives up
        try:
            refused = relay(self._app, ref.worker, messages)
        except BrokerError as exc:
            log.warning("layout.relay_failed", shard=str(ref), error=str(exc))
            self._report.broker_error("relay")
            return False
        self._leases.delete([m for m in messages if m.message_id not in refused])
        for j in (j for j in jobs if j.message.message_id in refused):
            error = unrelayable(refused[j.message.message_id])
            if not self._bury(ref, None, [j], morgue.REASON_INVALID, error, 0.0):
                self._leases.hide([j.message], INVALID_RETRY_SECONDS)
        return True

    @staticmethod
    def _chunk(jobs: list[_Job], start: int, size: int) -> list[_Job]:
        """Up to ``size`` jobs from ``start`` for one call; an invalid message alone."""
        if jobs[start].invalid is not None:
            return [jobs[start]]
        return list(takewhile(lambda job: job.invalid is None, jobs[start : start + size]))

    def _succeeded(
        self, ref: ShardRef, chunk: list[_Job], duration: float, done: list[Message] | None
    ) -> None:
        """Deleted now, or added to ``done`` (deleted by the caller)."""
        messages = [j.message for j in chunk]
        if done is None:
            self._leases.delete(messages)
        else:
            done.extend(messages)
        self._outcome(SUCCEEDED, ref, chunk, duration)
        self._attempts.forget(messages)

    def _retry(self, failed: list[_Job], later: list[_Job], delay: float) -> EntityEnd:
        """Keep the failed jobs and the entity's later ones together until the retry."""
        messages = [j.message for j in failed + later]
        due = self.clock() + delay
        if delay <= LOCAL_RETRY_SECONDS:
            self._attempts.local(j.message for j in failed)
            return EntityEnd(LATER, messages, due)
        self._attempts.unstarted(j.message for j in later)
        self._leases.hide(messages, delay)
        return EntityEnd(HIDDEN, messages, due)

    def _give_up(self, ref: ShardRef, jobs: list[_Job]) -> None:
        """Run none of these jobs: the first one's message lapsed (see the module doc)."""
        for job in jobs:
            if self._leases.lapsed(job.message):
                log.warning(
                    "job.lapsed",
                    worker=ref.worker,
                    shard=ref.shard,
                    entity=job.message.group_id,
                    message_id=job.message.message_id,
                    detail="its visibility ran out before it started; not run here, it is "
                    "delivered again",
                )
        self.give_up_later([j.message for j in jobs])

    def _decode(self, ref: ShardRef, message: Message) -> _Job:
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
            if env.entity != message.group_id:  # a signature covers the body, not the group
                raise EnvelopeError(
                    f"message names entity {env.entity!r} but has MessageGroupId "
                    f"{message.group_id!r}; they must be equal"
                )
        except (EnvelopeError, UnknownWorkerError) as exc:
            return _Job(message, None, invalid=exc, reason=reason)
        return _Job(message, env.payload, env.meta)

    def _bury(
        self,
        ref: ShardRef,
        worker: WorkerLike | None,
        chunk: list[_Job],
        reason: str,
        error: BaseException,
        duration: float,
    ) -> bool:
        """Write the chunk to the morgue; only then is it deleted and reported ``morgued``.
        False if that failed."""
        entity = chunk[0].message.group_id
        try:
            morgue.bury(
                self._app.store,
                ref.worker,
                [
                    morgue.record_for(j.message, reason, error, self.attempt(j.message), j.meta)
                    for j in chunk
                ],
            )
        except (morgue.StoreError, DamagedItem) as exc:  # the job waits, the node runs on
            log.error("job.morgue_failed", worker=ref.worker, entity=entity, error=str(exc))
            self._report.broker_error("morgue")
            return False
        self._leases.delete([j.message for j in chunk])
        if worker is not None:
            try:
                worker.retries_exhausted(entity, [j.payload for j in chunk], error)
            except BaseException:  # a user's hook: whatever it raises, logged
                log.exception("hook.retries_exhausted_failed", worker=ref.worker, entity=entity)
        self._outcome(MORGUED, ref, chunk, duration, error, reason=reason)
        self._attempts.forget(j.message for j in chunk)
        return True

    # -- reporting ---------------------------------------------------------------
    def _outcome(
        self,
        kind: str,
        ref: ShardRef,
        chunk: list[_Job],
        duration: float,
        error: BaseException | None = None,
        **extra: Any,
    ) -> None:
        messages, payloads = [j.message for j in chunk], [j.payload for j in chunk]
        self._report.outcome(kind, ref, messages, payloads, self.attempt, duration, error, **extra)

    def _worker(self, name: str) -> WorkerLike:
        """This thread's instance of the worker (``jobs`` and ``attempt`` are per call)."""
        workers: dict[str, WorkerLike] = vars(self._local_workers).setdefault("workers", {})
        if name not in workers:
            workers[name] = self._app.worker(name)()
        return workers[name]
