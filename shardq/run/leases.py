"""The one owner of received jobs: hold, extend, detect lapse, settle (in the
background, batched per queue, in order per message group). See docs/design/run.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor as Pool
from dataclasses import dataclass, field

import structlog

from shardq.broker.base import BatchResult, Broker, Message
from shardq.core.clock import Clock, monotonic, wall
from shardq.core.errors import BrokerError
from shardq.core.lease import CHANGE, DELETE, HELD, Lease
from shardq.core.limits import MAX_BATCH_ENTRIES, MAX_VISIBILITY_SECONDS
from shardq.run.threads import Threads, describe
from shardq.run.waits import Deadline, until_next_look, wait_until

log = structlog.get_logger("shardq.leases")


@dataclass
class _Request:
    queue: str
    kind: str  # DELETE or CHANGE (settle changes and extensions)
    #: Per entry: its lease, its seconds, whether it is an extension (not a settle).
    entries: list[tuple[Lease, float, bool]] = field(default_factory=list)
    urgent: bool = False  # holds an extension: send at once


class Leases:
    """Held messages of one node (or of one ``drain``). Thread-safe."""

    def __init__(
        self,
        broker: Broker,
        pool: Pool,
        *,
        interval: float = 1.0,
        on_broker_error: Callable[[str], None] = lambda operation: None,
        clock: Clock = monotonic,
        wall_clock: Clock = wall,
        threads: Threads | None = None,
    ) -> None:
        self._clock, self._wall = clock, wall_clock
        self._threads = threads or Threads()
        self._broker = broker
        self._linger = broker.settle_linger
        self._pool = pool
        self._interval = interval
        self._on_broker_error = on_broker_error
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # wakes the keeper
        self._answers = threading.Condition(lock)  # wakes who waits for settles answered
        self._wake_at = 0.0  # monotonic time the keeper wakes up by itself
        self._asked = 0  # settles asked for since the keeper last looked
        self._held: dict[str, Lease] = {}  # by receipt
        self._settling: dict[str, Lease] = {}  # by receipt, in the order asked for
        self._extend_at = 0.0  # monotonic time of the next look for extensions due
        # message id -> (queue, group, Unix time visible again): hidden here for a retry
        self._hidden: dict[str, tuple[str, str, float]] = {}
        self._closed = False
        self._flushing = 0  # callers of flush(): send settles without lingering
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self._thread = self._threads.start("shardq-leases", "the lease keeper", self._loop)

    def close(self, timeout: float) -> bool:
        """Send every pending settle (waiting up to ``timeout``), then stop extending.
        True if nothing was left unsettled."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` (:mod:`shardq.run.waits`) until every settle asked for
        so far was sent and answered; meanwhile settles are sent without lingering."""
        deadline = Deadline(self._clock, timeout)
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                wait_until(self._answers, self._flushed, deadline)
            finally:
                self._flushing -= 1
            return not self._settling

    def _flushed(self) -> bool:
        """Nothing is left to settle, or nobody is left to settle it (the lock held)."""
        return not self._settling or self._thread is None or not self._thread.is_alive()

    # -- holding -----------------------------------------------------------------
    def hold(self, messages: Iterable[Message], visibility_timeout: float) -> None:
        """Hold messages just received with ``visibility_timeout``."""
        now = self._clock()
        due = now + visibility_timeout - self._margin(visibility_timeout)
        with self._cond:
            for m in messages:
                self._held[m.receipt] = Lease(m, visibility_timeout, now + visibility_timeout)
                self._hidden.pop(m.message_id, None)
            self._extend_at = min(self._extend_at, due)

    def lapsed(self, message: Message) -> bool:
        """:meth:`shardq.core.lease.Lease.lapsed`; a message not held here is not lapsed."""
        lease = self._held.get(message.receipt)  # no lock: one read of each field
        return lease is not None and lease.lapsed(self._clock())

    def may_start(self, message: Message) -> bool:
        """Held here, not being settled and not :meth:`lapsed`: a job may start."""
        lease = self._held.get(message.receipt)  # no lock: one read of each field
        return lease is not None and lease.state == HELD and not lease.lapsed(self._clock())

    def count(self) -> int:
        with self._cond:
            return len(self._held)

    def settling(self, queue: str) -> set[str]:
        """Receipts of ``queue`` whose delete or visibility change is not answered yet."""
        with self._cond:
            return {
                receipt
                for receipt, lease in self._held.items()
                if lease.state != HELD and lease.message.queue == queue
            }

    def wait_released(self, receipts: Iterable[str], timeout: float) -> bool:
        """Wait up to ``timeout`` (:mod:`shardq.run.waits`) until none of ``receipts`` is
        held here; True if none is."""
        left = set(receipts)
        with self._cond:
            return wait_until(
                self._answers,
                lambda: not any(r in self._held for r in left),
                Deadline(self._clock, timeout),
            )

    def hidden(self, queue: str) -> tuple[set[str], int]:
        """Groups of ``queue`` where this node hid a job for a retry not received again
        since, and how many such jobs are still hidden."""
        now = self._wall()
        with self._cond:
            mine = [(group, until) for q, group, until in self._hidden.values() if q == queue]
        return {group for group, _ in mine}, sum(until > now for _, until in mine)

    def held(self, state: str | None = None) -> list[Message]:
        """Messages held (in one ``state``: held, delete or change)."""
        with self._cond:
            return [
                lease.message
                for lease in self._held.values()
                if state is None or lease.state == state
            ]

    # -- settling ----------------------------------------------------------------
    def delete(self, messages: Sequence[Message]) -> None:
        """The jobs are done: delete them (they stay held until the broker confirms)."""
        self._settle(messages, DELETE, 0.0)

    def hide(self, messages: Sequence[Message], seconds: float) -> None:
        """Make the messages visible again after ``seconds`` (0: at once), in order."""
        self._settle(messages, CHANGE, seconds)

    def forget(self, messages: Iterable[Message]) -> None:
        """Stop extending; the broker returns them when their visibility ends."""
        with self._cond:
            for m in messages:
                self._drop(m.receipt)
            self._cond.notify_all()
            self._answers.notify_all()

    def _settle(self, messages: Sequence[Message], kind: str, seconds: float) -> None:
        now, wall = self._clock(), self._wall()
        with self._cond:
            for m in messages:
                lease = self._held.get(m.receipt)
                if lease is None or lease.state != HELD:
                    continue
                cap = m.received_at + MAX_VISIBILITY_SECONDS - wall - 1
                lease.state, lease.seconds, lease.asked = kind, max(0.0, min(seconds, cap)), now
                self._settling[m.receipt] = lease
                self._asked += 1
            # wake the keeper if a batch may be full or it would sleep past this linger
            if self._asked >= MAX_BATCH_ENTRIES or self._wake_at > now + self._linger:
                self._cond.notify_all()

    # -- the keeper's loop ---------------------------------------------------------
    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                now = self._clock()
                self._wake_at = now + self._dispatch(now)
                while not self._closed:  # until woken, or the clock reaches _wake_at
                    left = self._wake_at - self._clock()
                    if left <= 0 or self._cond.wait(until_next_look(self._clock, left)):
                        break

    def _dispatch(self, now: float) -> float:
        """Send what is due (lock held); returns how long to wait for the next thing."""
        wait = self._interval
        self._asked = 0
        requests: dict[tuple[str, str], list[_Request]] = {}
        groups: dict[tuple[str, str], _Request | None] = {}  # None: wait for an earlier change
        added: set[int] = set()
        for lease in self._settling.values():
            if lease.busy and lease.state == DELETE:
                continue  # in flight: its answer wakes the keeper
            m = lease.message
            key = (m.queue, m.group_id)
            waiting = lease.busy or lease.not_before > now
            if lease.not_before > now:
                wait = min(wait, lease.not_before - now)
            if lease.state == CHANGE:
                if key in groups and groups[key] is None:
                    continue
                if waiting:
                    groups[key] = None  # later changes of the group wait for this one
                    continue
                into = groups.get(key)
                if into is not None and len(into.entries) >= MAX_BATCH_ENTRIES:
                    continue
                groups[key] = self._add(requests, lease, CHANGE, lease.seconds, False, into)
            elif not waiting:
                self._add(requests, lease, DELETE, 0.0)
            else:
                continue
            added.add(id(lease))
        if now >= self._extend_at:
            self._extend_at = self._extensions(requests, added, now)
        wait = min(wait, self._extend_at - now)
        for items in requests.values():
            for request in items:
                oldest = min(lease.asked for lease, _, _ in request.entries)
                young = now - oldest < self._linger
                filling = not request.urgent and len(request.entries) < MAX_BATCH_ENTRIES
                if young and filling and not (self._closed or self._flushing):
                    wait = min(wait, self._linger - (now - oldest))
                    continue  # let it fill up a little
                for lease, _, _ in request.entries:
                    lease.busy = True
                self._pool.submit(self._send, request, self._clock())
        return max(0.001, wait)

    def _extensions(
        self, requests: dict[tuple[str, str], list[_Request]], added: set[int], now: float
    ) -> float:
        """Add the extensions due to ``requests``; returns when the next one is due."""
        next_at = now + self._interval
        for lease in self._held.values():
            if lease.busy or lease.lost or lease.state == CHANGE or id(lease) in added:
                continue
            due = lease.expires - self._margin(lease.visibility_timeout)
            if due > now:
                next_at = min(next_at, due)
                continue
            seconds = lease.extension(self._wall())
            if seconds is not None:
                self._add(requests, lease, CHANGE, seconds, True).urgent = True
        return next_at

    def _margin(self, visibility_timeout: float) -> float:
        """Extend when less than this remains: half the timeout, two rounds at least."""
        return max(visibility_timeout / 2, 2 * self._interval)

    def _add(
        self,
        requests: dict[tuple[str, str], list[_Request]],
        lease: Lease,
        kind: str,
        seconds: float,
        extend: bool = False,
        into: _Request | None = None,
    ) -> _Request:
        if into is None:
            bucket = requests.setdefault((lease.message.queue, kind), [])
            if not bucket or len(bucket[-1].entries) >= MAX_BATCH_ENTRIES:
                bucket.append(_Request(lease.message.queue, kind))
            into = bucket[-1]
        into.entries.append((lease, seconds, extend))
        return into

    # -- one request, in a pool thread ------------------------------------------------
    def _send(self, request: _Request, sent: float) -> None:
        entries = [(lease.message.receipt, seconds) for lease, seconds, _ in request.entries]
        try:
            if request.kind == DELETE:
                result = self._broker.delete_batch(request.queue, [r for r, _ in entries])
            else:
                result = self._broker.change_visibility_batch(request.queue, entries)
            error: BaseException | None = None
        # a BrokerError; any other is a bug, not an outage: the node stops (a BaseException
        # too: left unread in the pool's future, it would keep the lease busy for ever)
        except BaseException as exc:
            result, error = BatchResult(), exc
        try:  # (before the answer: a flush that ends then finds the node failed)
            if error is not None and not isinstance(error, BrokerError):
                self._threads.fail(f"a request to {request.queue}", error)
        finally:
            with self._cond:
                self._answered(request, sent, result, error)
                # A delete answered leaves the keeper nothing to send, unless it failed.
                if request.kind != DELETE or error is not None:
                    self._cond.notify_all()
                self._answers.notify_all()

    def _answered(
        self, request: _Request, sent: float, result: BatchResult, error: BaseException | None
    ) -> None:
        now = self._clock()
        if error is not None:
            self._on_broker_error("delete" if request.kind == DELETE else "visibility")
            log.warning(
                "lease.request_failed",
                queue=request.queue,
                operation=request.kind,
                messages=len(request.entries),
                error=str(error) if isinstance(error, BrokerError) else describe(error),
            )
        for lease, seconds, extension in request.entries:
            refused = result.failed.get(lease.message.receipt)
            if not lease.answered(seconds, extension, sent, now, error, refused):
                continue
            if request.kind == CHANGE and seconds > 0 and error is None and refused is None:
                m = lease.message
                self._hidden[m.message_id] = (m.queue, m.group_id, self._wall() + seconds)
                if len(self._hidden) > 10_000:  # forget those long visible again
                    old = self._wall() - 3600
                    self._hidden = {k: v for k, v in self._hidden.items() if v[2] > old}
            self._drop(lease.message.receipt)

    def _drop(self, receipt: str) -> None:
        self._held.pop(receipt, None)
        self._settling.pop(receipt, None)


def extend_interval(visibility_timeouts: Iterable[float]) -> float:
    """Seconds between looks for extensions due, for the shortest visibility timeout."""
    return max(0.1, min(1.0, min(visibility_timeouts, default=60) / 6))
