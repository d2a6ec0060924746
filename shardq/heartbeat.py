"""Keeping received jobs invisible while the node holds them, and enforcing time limits.

One heartbeat thread per node:

* **Visibility.** Every message the node has received and not yet deleted or
  released is tracked. When less than half of its visibility timeout remains, its
  visibility is extended by a full timeout (batched per queue, 10 per request), for
  as long as the node holds it and within SQS's 12 hours after the receive. So no
  other node sees a job that is running or waiting its turn here, however long it
  takes. A message that is deleted or released is untracked at once and never
  extended again.
* **Time limits.** A ``perform`` that runs past its worker's ``time_limit`` gets
  :class:`TimeLimitExceeded` raised inside its thread. Python cannot kill a
  thread: the exception arrives at the next Python bytecode the thread runs. Code
  blocked inside a C call (a socket read with no timeout, ``time.sleep``, a database
  driver call) is interrupted only when that call returns. Until ``perform``
  actually ends, its messages stay invisible, so the entity never runs twice at
  once. Put timeouts on your I/O.

A message whose visibility ran out before it was extended (the broker was
unreachable, or the heartbeat late) or whose extension the broker refused is
**lapsed**: another node may have received it, so the node does not start it
(:meth:`Heartbeat.lapsed`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from shardq.broker.base import Broker, Message, batches
from shardq.errors import BrokerError
from shardq.limits import MAX_VISIBILITY_SECONDS

T = TypeVar("T")
log = structlog.get_logger("shardq.heartbeat")


class TimeLimitExceeded(Exception):
    """Raised inside ``perform`` when it runs longer than the worker's ``time_limit``."""


@dataclass
class _Held:
    message: Message
    visibility_timeout: float
    expires: float  # monotonic time at which the message becomes visible again


@dataclass
class _Running:
    thread_id: int
    deadline: float
    fired: bool = False
    done: bool = False


class Heartbeat:
    """Extends visibility of held messages and raises time limits in overrunning jobs."""

    def __init__(self, broker: Broker, *, interval: float = 1.0) -> None:
        self._broker = broker
        self._interval = interval
        self._lock = threading.Lock()
        # Held for a whole extension round, so that once drop() returns no round
        # in progress can extend (and so re-hide) a message just released.
        self._round = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._lost: set[str] = set()  # held, then refused an extension; until dropped
        self._running: dict[int, _Running] = {}
        self._next_token = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shardq-heartbeat", daemon=True)

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # -- held messages -----------------------------------------------------------
    def hold(self, messages: Iterable[Message], visibility_timeout: float) -> None:
        """Track messages just received with ``visibility_timeout``."""
        now = time.monotonic()
        with self._lock:
            for m in messages:
                self._held[m.receipt] = _Held(m, visibility_timeout, now + visibility_timeout)

    def drop(self, receipts: Iterable[str]) -> None:
        """Stop extending these messages (deleted, released or retried later).

        Call it before releasing: when it returns, no extension of them is in flight.
        """
        with self._round, self._lock:
            for receipt in receipts:
                self._held.pop(receipt, None)
                self._lost.discard(receipt)

    def lapsed(self, receipts: Iterable[str]) -> bool:
        """True if any of these held messages is no longer the node's to run: its
        visibility ran out without an extension, or the broker refused to extend it.
        Messages never held here are not lapsed."""
        now = time.monotonic()
        with self._lock:
            for receipt in receipts:
                held = self._held.get(receipt)
                if receipt in self._lost or (held is not None and held.expires <= now):
                    return True
        return False

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    def held(self) -> list[Message]:
        with self._lock:
            return [h.message for h in self._held.values()]

    # -- time limits -------------------------------------------------------------
    def run_limited(self, fn: Callable[[], T], time_limit: float | None) -> tuple[T | None, bool]:
        """Run ``fn`` in this thread; returns (result, overran).

        ``overran`` is True when the time limit passed, even if ``fn`` swallowed
        the :class:`TimeLimitExceeded` raised in it.
        """
        if time_limit is None:
            return fn(), False
        with self._lock:
            token = self._next_token = self._next_token + 1
            self._running[token] = _Running(threading.get_ident(), time.monotonic() + time_limit)
        try:
            return fn(), self._finish(token)
        except TimeLimitExceeded:
            self._finish(token)
            raise
        except BaseException:
            if self._finish(token):
                raise TimeLimitExceeded(f"perform ran longer than {time_limit} s") from None
            raise

    def _finish(self, token: int) -> bool:
        with self._lock:
            job = self._running.pop(token, None)
            if job is None:
                return True
            job.done = True
            if job.fired:  # a raise that has not been delivered yet must not escape
                _async_raise(job.thread_id, None)
            return job.fired

    # -- the loop ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive any single failure
                log.exception("heartbeat.failed")

    def beat(self) -> None:
        """One round: enforce time limits, then extend what is due."""
        with self._round:
            self._beat()

    def _beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            for job in self._running.values():
                if not job.fired and not job.done and now >= job.deadline:
                    job.fired = True
                    _async_raise(job.thread_id, TimeLimitExceeded)
            due = [
                h
                for h in self._held.values()
                if h.expires - now < max(h.visibility_timeout / 2, 2 * self._interval)
            ]
        by_queue: dict[str, list[_Held]] = {}
        for h in due:
            by_queue.setdefault(h.message.queue, []).append(h)
        for queue, items in by_queue.items():
            for chunk in batches(items):
                self._extend(queue, chunk)

    def _extend(self, queue: str, items: list[_Held]) -> None:
        wall = time.time()
        changes = []
        for h in items:
            room = h.message.received_at + MAX_VISIBILITY_SECONDS - wall - 1
            seconds = min(h.visibility_timeout, room)
            if seconds <= 0:
                log.warning(
                    "heartbeat.cap_reached",
                    queue=queue,
                    message_id=h.message.message_id,
                    detail="12 h since receive; SQS will redeliver this job",
                )
                with self._lock:
                    if self._held.pop(h.message.receipt, None) is not None:
                        self._lost.add(h.message.receipt)
                continue
            changes.append((h, seconds))
        if not changes:
            return
        try:
            result = self._broker.change_visibility_batch(
                queue, [(h.message.receipt, s) for h, s in changes]
            )
        except BrokerError as exc:
            log.warning("heartbeat.extend_failed", queue=queue, error=str(exc))
            return
        now = time.monotonic()
        with self._lock:
            for h, seconds in changes:
                if h.message.receipt in result.failed:
                    if self._held.pop(h.message.receipt, None) is not None:
                        self._lost.add(h.message.receipt)
                    log.warning(
                        "heartbeat.lost",
                        queue=queue,
                        message_id=h.message.message_id,
                        reason=result.failed[h.message.receipt],
                    )
                elif h.message.receipt in self._held:
                    h.expires = now + seconds


def _async_raise(thread_id: int, exc: Any) -> None:
    """Raise ``exc`` (a class, or None to cancel) asynchronously in a thread."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )
