"""Time limits: a ``perform`` that runs past its worker's ``time_limit`` fails
(docs/design/run.md, "Time limits and async workers").
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from shardq.core.clock import Clock, monotonic
from shardq.run.threads import Threads
from shardq.run.waits import until_next_look

T = TypeVar("T")
#: A call still running this long past its limit is logged (``job.stuck``), once.
STUCK_SECONDS = 5.0
log = structlog.get_logger("shardq.timelimit")


class TimeLimitExceeded(Exception):
    """Raised inside ``perform`` when it runs longer than the worker's ``time_limit``."""


@dataclass
class Running:
    thread_id: int
    deadline: float
    fired: bool = False
    done: bool = False
    #: What the call is (for ``job.stuck``), and whether the watch interrupts it (not an
    #: async call: its limit is a cancellation on the event loop).
    about: dict[str, Any] = field(default_factory=dict)
    interrupt: bool = True
    warned: bool = False
    #: Whether it is what holds its thread up now (an async call waiting behind another
    #: that holds the event loop is not: only that one is named).
    holds_up: Callable[[], bool] | None = None


class TimeLimits:
    """Watches running ``perform`` calls that have a time limit (one thread per node,
    started on first use, idle while nothing limited runs)."""

    def __init__(self, clock: Clock = monotonic, threads: Threads | None = None) -> None:
        self._cond, self._clock = threading.Condition(), clock
        #: Who starts its thread (and the event loop's of async workers: :mod:`.aio`).
        self.threads = threads or Threads()
        self._running: dict[int, Running] = {}
        self._next_token = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(
        self,
        fn: Callable[[], T],
        time_limit: float | None,
        about: dict[str, Any] | None = None,
        *,
        interrupt: bool = True,
        holds_up: Callable[[], bool] | None = None,
    ) -> tuple[T | None, bool]:
        """Run ``fn`` in this thread; returns (result, overran): whether the limit passed,
        even if ``fn`` swallowed the :class:`TimeLimitExceeded` raised in it. ``about``
        (worker, entity...) names it if still running :data:`STUCK_SECONDS` past its limit;
        ``interrupt=False``: never interrupted (nor overran), only named; ``holds_up()`` (if
        given) says whether it is what holds its thread up: only then is it named."""
        if time_limit is None:
            return fn(), False
        with self._cond:
            token = self._next_token = self._next_token + 1
            deadline, about = self._clock() + time_limit, about or {}
            self._running[token] = Running(
                threading.get_ident(), deadline, about=about, interrupt=interrupt, holds_up=holds_up
            )
            if self._thread is None or not self._thread.is_alive():
                what = "the time-limit watch"
                self._thread = self.threads.start("shardq-timelimits", what, self._watch)
            self._cond.notify()
        try:
            return fn(), self._finish(token)
        except TimeLimitExceeded:
            self._finish(token)
            raise
        except BaseException:
            if self._finish(token):
                raise TimeLimitExceeded(f"perform ran longer than {time_limit} s") from None
            raise

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _finish(self, token: int) -> bool:
        with self._cond:
            job = self._running.pop(token, None)
            if job is None:
                return True
            job.done = True
            if job.fired:  # a raise that has not been delivered yet must not escape
                _async_raise(job.thread_id, None)
            return job.fired

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                due, wait = overdue(self._running.values(), now := self._clock())
                for job in due:
                    job.fired = True
                    _async_raise(job.thread_id, TimeLimitExceeded)
                late, later = stuck(self._running.values(), now)
                for job in late:
                    job.warned = True
                    log.warning(
                        "job.stuck",
                        **job.about,
                        detail=f"still running {STUCK_SECONDS:g} s past its time limit: a "
                        "sync perform blocked in a call the limit cannot interrupt, or an async "
                        "one that does not yield (every async job of the node waits for it); its "
                        "entity's later jobs wait, other entities run",
                    )
                wait = min(wait, later)
                # while calls run, a clock that may jump (a test's) is read every step
                self._cond.wait(until_next_look(self._clock, wait) if self._running else wait)


def overdue(running: Iterable[Running], now: float) -> tuple[list[Running], float]:
    """The calls past their deadline at ``now`` (not fired, not done), and how long to
    wait: until the next deadline (at least 5 ms), else 1 s."""
    pending = [j for j in running if j.interrupt and not j.fired and not j.done]
    waits = [j.deadline - now for j in pending if now < j.deadline]
    return [j for j in pending if now >= j.deadline], max(0.005, min(waits)) if waits else 1.0


def stuck(running: Iterable[Running], now: float) -> tuple[list[Running], float]:
    """The calls still running :data:`STUCK_SECONDS` past their deadline at ``now`` and
    holding their thread up, not named yet, and how long until the next one would be (1 s
    if none; one waiting behind another is looked at again then)."""
    live = [(j, j.deadline + STUCK_SECONDS - now) for j in running if not (j.done or j.warned)]
    waits = [left for _, left in live if left > 0]
    late = [j for j, left in live if left <= 0 and (j.holds_up is None or j.holds_up())]
    return late, max(0.005, min(waits)) if waits else 1.0


def _async_raise(thread_id: int, exc: Any) -> None:
    """Raise ``exc`` (a class, or None to cancel) asynchronously in a thread."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )
