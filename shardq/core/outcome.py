"""What became of jobs: a ``perform`` call's :class:`Outcome`, logged and told to each
:class:`Observer` by the :class:`Reporter`, and how a run of one entity's jobs ended
(:class:`EntityEnd`), which the execution slots act on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from shardq.core.clock import Clock, monotonic
from shardq.core.errors import Retry
from shardq.core.messages import Message
from shardq.core.plan import ShardRef

log = structlog.get_logger("shardq.job")

#: What can become of a job's run: the kinds of :class:`Outcome` (and :class:`Tally`'s fields).
SUCCEEDED, RETRIED, MORGUED = "succeeded", "retried", "morgued"
KINDS = (SUCCEEDED, RETRIED, MORGUED)


@dataclass(frozen=True)
class Outcome:
    """What became of one ``perform`` call's jobs (or of one invalid message)."""

    kind: str  # one of KINDS
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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, kind: str, worker: str, n: int = 1) -> None:
        counter: dict[str, int] = getattr(self, kind)
        with self._lock:  # the node's slots add at once
            counter[worker] = counter.get(worker, 0) + n

    def copy(self) -> Tally:
        with self._lock:
            return Tally(dict(self.succeeded), dict(self.retried), dict(self.morgued))

    def done(self) -> dict[str, int]:
        """Jobs that ran to an end (succeeded or morgued), per worker."""
        workers = {*self.succeeded, *self.morgued}
        return {w: self.succeeded.get(w, 0) + self.morgued.get(w, 0) for w in workers}

    def rates(self, before: Mapping[str, int], seconds: float) -> dict[str, float]:
        """Jobs done per second per worker since ``seconds`` ago (:meth:`done` was ``before``)."""
        return {w: (n - before.get(w, 0)) / seconds for w, n in self.done().items()}

    def job_outcome(self, outcome: Outcome) -> None:
        self.add(outcome.kind, outcome.worker, len(outcome.messages))

    def broker_error(self, operation: str) -> None:
        """Broker errors are logged; a tally does not count them."""


@dataclass(frozen=True)
class Deferred:
    """Jobs of one entity held for a retry due at ``due`` (monotonic)."""

    due: float
    ref: ShardRef
    messages: list[Message]


#: How a run of one entity's jobs ended (:attr:`EntityEnd.kind`).
DONE = "done"  # every job ran to an end (succeeded, morgued or relayed)
LATER = "later"  # held here for a local retry (``messages``, due at ``due``)
HIDDEN = "hidden"  # ``messages`` hidden at the broker until ``due``, the failed job first
GAVE_UP = "gave_up"  # a job's visibility lapsed: none of the rest (``messages``) runs here
STOPPED = "stopped"  # asked to stop: ``messages`` did not start (still held)


@dataclass(frozen=True)
class EntityEnd:
    """The end of a run of one entity's jobs; what the jobs that join the entity
    afterwards must follow (a retry takes them along)."""

    kind: str
    messages: list[Message] = field(default_factory=list)
    due: float = 0.0
    performed: float = 0.0  # DONE: seconds its jobs' ``perform`` calls took


class Reporter:
    """Logs each job's outcome (one ``job.<kind>`` event per job: success at debug, an
    asked-for retry at info, any other failure at warning) and tells every observer."""

    def __init__(self, observers: Sequence[Observer] = (), clock: Clock = monotonic) -> None:
        self.observers, self._clock = list(observers), clock
        self._debug, self._debug_until = False, float("-inf")  # when to ask the level (``clock``)

    def outcome(
        self,
        kind: str,
        ref: ShardRef,
        messages: list[Message],
        payloads: list[Any],
        attempt: Callable[[Message], int],
        duration: float,
        error: BaseException | None = None,
        **extra: Any,
    ) -> None:
        if kind == SUCCEEDED:
            level = logging.DEBUG
            now = self._clock()
            if now >= self._debug_until:  # asked once a second, not once per job
                check = getattr(log.bind(), "is_enabled_for", None)
                self._debug = True if check is None else bool(check(logging.DEBUG))
                self._debug_until = now + 1.0
        elif kind == RETRIED and isinstance(error, Retry):
            level = logging.INFO
        else:
            level = logging.WARNING
        if level > logging.DEBUG or self._debug:
            if error is not None:
                extra["error"] = f"{type(error).__name__}: {error}"
            for m in messages:
                log.log(
                    level,
                    f"job.{kind}",
                    worker=ref.worker,
                    shard=ref.shard,
                    entity=m.group_id,
                    message_id=m.message_id,
                    attempt=attempt(m),
                    duration=round(duration, 6),
                    **extra,
                )
        outcome = Outcome(
            kind, ref.worker, ref.shard, messages[0].group_id, messages, payloads, duration, error
        )
        for observer in self.observers:
            try:
                observer.job_outcome(outcome)
            except Exception:
                log.exception("observer.failed", observer=type(observer).__name__)

    def broker_error(self, operation: str) -> None:
        for observer in self.observers:
            observer.broker_error(operation)
