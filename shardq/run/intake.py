"""A node's intake: receives for its lanes and idle watch (held by its leases at once),
its stop flag, and the ``job.old`` warning (SQS deletes a message older than its queue's
retention, run or not).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import structlog

from shardq.broker.base import Broker, Message, release_now
from shardq.core.clock import Clock, monotonic, wall
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.lease import hand_back
from shardq.core.limits import MAX_BATCH_ENTRIES, MIN_RETENTION_SECONDS
from shardq.run.leases import Leases
from shardq.run.shard import Shard
from shardq.run.waits import Deadline, wait_until

log = structlog.get_logger("shardq.node")

#: Message ids remembered as already warned about (oldest forgotten first).
REMEMBERED = 10_000


def too_old(sent_at: float, now: float, retention: float | None, share: float) -> bool:
    """Is a job sent at ``sent_at`` older than ``share`` of its queue's ``retention`` at
    ``now`` (None: the queue keeps messages; a share of 0 turns the warning off)?"""
    if retention is None or share <= 0:
        return False
    return now - sent_at > share * retention


class OldJobs:
    """Warns (``job.old``) once per message about received jobs :func:`too_old`."""

    def __init__(self, broker: Broker, share: float, clock: Clock = wall) -> None:
        self.broker = broker
        self.share = share
        self.clock = clock
        self._warned: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, messages: Sequence[Message]) -> int:
        """Log ``job.old`` for each message newly found too old; returns how many."""
        if self.share <= 0 or not messages:
            return 0
        now = self.clock()
        if now - min(m.sent_at for m in messages) <= self.share * MIN_RETENTION_SECONDS:
            return 0  # too young for any queue's retention: no need to read this one's
        try:
            retention = self.broker.retention_seconds(messages[0].queue)
        except BrokerError:
            return 0  # the next receive asks again
        warned = 0
        for message in messages:
            if not too_old(message.sent_at, now, retention, self.share):
                continue
            with self._lock:
                if message.message_id in self._warned:
                    continue
                self._warned[message.message_id] = None
                if len(self._warned) > REMEMBERED:
                    self._warned.popitem(last=False)
            warned += 1
            log.warning(
                "job.old",
                queue=message.queue,
                message_id=message.message_id,
                entity=message.group_id,
                age_seconds=round(now - message.sent_at, 1),
                retention_seconds=retention,
                hint="SQS deletes it unrun at its queue's retention: add nodes or fix the "
                "entity's failing job",
            )
        return warned


class Intake:
    """What lanes, pollers and the watcher get of the node: receiving, its stop flag."""

    def __init__(
        self,
        broker: Broker,
        leases: Leases,
        old_jobs: OldJobs,
        pool: ThreadPoolExecutor,
        *,
        fail: Callable[[str, BaseException], None],
        broker_error: Callable[[str], None],
        clock: Clock = monotonic,
        one_file: bool = False,
    ) -> None:
        self.broker = broker
        self.leases = leases
        self.old_jobs = old_jobs
        #: Runs the lanes' receives ahead of their shards' turns.
        self.pool = pool
        #: Set once the node began to stop: nothing new starts.
        self.stopping = threading.Event()
        #: A part of the node died for an unexpected reason: stop with exit code 1.
        self.fail = fail
        self._broker_error, self._clock = broker_error, clock
        self._receiving: dict[str, set[int]] = {}  # queue -> receives in flight (numbered)
        self._brought: dict[str, int] = {}  # queue -> jobs its receives brought so far
        self._lost: dict[str, float] = {}  # queue -> until a failed receive's jobs may hide
        self._numbers = itertools.count()
        #: queue -> (seconds, until, whether the file failed: not the queue's own failure)
        self._backoff: dict[str, tuple[float, float, bool]] = {}
        self._one_file = one_file  # the embedded broker: a receive that works proves them all
        self._received = threading.Condition()

    def stop(self) -> None:
        """Begin the node's graceful shutdown (idempotent, from any thread)."""
        self.stopping.set()
        self.broker.wake_waiters()

    def receive(self, shard: Shard, wait_seconds: float) -> list[Message] | None:
        """Receive a batch of ``shard`` and hold it; None (logged) if the broker failed,
        or if shutdown began: then no receive starts (a long poll on SQS cannot be cut
        short), and what one in flight brings is released (:meth:`release_straggler`)."""
        queue, number, messages, failed = shard.queue, next(self._numbers), None, 0
        with self._received:
            self._receiving.setdefault(queue, set()).add(number)
        try:
            if self.stopping.is_set():  # checked once counted, so quiet() waits for it
                return None
            began = self._clock()  # a failure is judged by when its receive began (slow ones)
            messages = self.broker.receive(
                queue,
                max_messages=MAX_BATCH_ENTRIES,
                wait_seconds=wait_seconds,
                visibility_timeout=shard.visibility_timeout,
            )
            if self._backoff:  # after failures only
                self._end_backoffs(queue)
            if messages:
                self.leases.hold(messages, shard.visibility_timeout)
                self.old_jobs.check(messages)
            if self.stopping.is_set():
                self.release_straggler(messages)
                return None
            return messages
        except BrokerError as exc:
            self.broker_trouble("receive", queue, exc)
            failed = 0 if isinstance(exc, QueueNotFoundError) else 1  # (a missing queue: none)
            seconds, until, _ = self._backoff.get(queue, (0.25, began, False))
            # a receive begun long after the last failure (its backoff over by as long
            # again) starts over; the wait counts from when this one failed
            seconds = 0.5 if began > until + max(seconds, 1.0) else min(30.0, 2 * seconds)
            shared = self._one_file and not isinstance(exc, QueueNotFoundError)
            self._backoff[queue] = (seconds, self._clock() + seconds, shared)
            return None
        finally:
            with self._received:
                receiving = self._receiving[queue]
                receiving.discard(number)
                if failed:  # it may have taken jobs (its answer lost): hidden for their timeout
                    now = self._clock()
                    self._lost = {q: t for q, t in self._lost.items() if t > now}
                    self._lost[queue] = now + shard.visibility_timeout
                if not receiving:
                    del self._receiving[queue]
                brought = self._brought.get(queue, 0) + len(messages or ()) + failed
                if shard.dropped and not receiving:  # served here no more: forgotten
                    self._brought.pop(queue, None)
                else:
                    self._brought[queue] = brought
                self._received.notify_all()

    def forget(self, queue: str) -> None:
        """The shard of ``queue`` was dropped: forget what its receives brought (at once
        if none is in flight, else as the last ends)."""
        with self._received:
            if queue not in self._receiving:
                self._brought.pop(queue, None)

    def receives(self, queue: str) -> tuple[int, set[int]]:
        """How many jobs the receives of ``queue`` brought so far, and the receives of
        ``queue`` in flight (numbers, each receive its own); they are held once counted."""
        with self._received:
            return self._brought.get(queue, 0), set(self._receiving.get(queue, ()))

    def unsure(self, queue: str) -> bool:
        """A receive of ``queue`` failed lately: jobs it may have taken could be hidden
        there still (counted as brought by :meth:`receives`)."""
        return self._clock() < self._lost.get(queue, 0.0)

    def _end_backoffs(self, queue: str) -> None:
        """A receive of ``queue`` worked: its wait ends, and on the embedded broker the
        file's (not other queues' own failures)."""
        if self._one_file:
            for other in [q for q, b in list(self._backoff.items()) if b[2]]:
                self._backoff.pop(other, None)
        self._backoff.pop(queue, None)

    def backing_off(self, queue: str) -> bool:
        """A receive of ``queue`` failed lately: the next waits (0.5 s, doubling to 30 s,
        from 0.5 s again after a quiet spell; on the embedded broker any queue's successful
        receive ends every queue's wait but for a missing queue's: they share one file)."""
        backoff = self._backoff.get(queue)
        return backoff is not None and self._clock() < backoff[1]

    def quiet(self, queues: set[str], timeout: float) -> bool:
        """Wait up to ``timeout`` (:mod:`shardq.run.waits`) until no receive of ``queues``
        is in flight: a stopping node that released jobs there lets a long poll that took
        them release them. True if none is."""
        with self._received:
            return wait_until(
                self._received,
                lambda: not any(self._receiving.get(q) for q in queues),
                Deadline(self._clock, timeout),
            )

    def release_straggler(self, messages: list[Message] | None) -> None:
        """Messages a receive brought after shutdown began, or after their shard was
        dropped: visible again at once (never run here)."""
        if not messages:
            return
        if self.stopping.is_set():
            self.leases.forget(messages)
            release_now(self.broker, messages)
        else:
            for batch, seconds in hand_back(messages):
                self.leases.hide(batch, seconds)

    def broker_trouble(self, operation: str, queue: str | None, exc: BaseException) -> None:
        log.warning(f"node.{operation}_failed", queue=queue, error=str(exc))
        self._broker_error(operation)
