"""What became of jobs: a ``perform`` call's :class:`Outcome` (told to each
:class:`Observer`: the node's :class:`Tally`, its metrics, test helpers), and how a
run of one entity's jobs ended (:class:`EntityEnd`), which the execution slots act on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardq.broker.base import Message
from shardq.plan import ShardRef


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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, kind: str, worker: str, n: int = 1) -> None:
        counter: dict[str, int] = getattr(self, kind)
        with self._lock:  # the node's slots add at once
            counter[worker] = counter.get(worker, 0) + n

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
HIDDEN = "hidden"  # hidden at the broker until ``due``, the failed job first
GAVE_UP = "gave_up"  # a job's visibility lapsed: none of the rest runs here
STOPPED = "stopped"  # asked to stop: ``messages`` did not start (still held)


@dataclass(frozen=True)
class EntityEnd:
    """The end of a run of one entity's jobs; what the jobs that join the entity
    afterwards must follow (a retry takes them along)."""

    kind: str
    messages: list[Message] = field(default_factory=list)
    due: float = 0.0
