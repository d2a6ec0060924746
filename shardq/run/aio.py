"""Calling ``perform``: a sync worker's in the calling thread, an async worker's on the
node's one event loop; inside the app's middleware, within the worker's ``time_limit``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from shardq.core.clock import Clock, monotonic
from shardq.core.jobs import JobInfo, WorkerLike, WorkerSettings
from shardq.core.middleware import Middleware, PerformContext, run_around
from shardq.run.threads import Threads
from shardq.run.timelimit import STUCK_SECONDS, TimeLimitExceeded, TimeLimits


@dataclass
class OnLoop:
    """Where a call is: handed to the event loop (``waiting``), its task once it started,
    and from when it may be named stuck (its limit and STUCK_SECONDS after it started)."""

    waiting: bool = False
    task: asyncio.Task[Any] | None = None
    stuck_from: float = 0.0


class EventLoop:
    """The node's event loop for async workers, started on first use. Thread-safe."""

    def __init__(self, threads: Threads | None = None, clock: Clock = monotonic) -> None:
        self._lock, self._clock = threading.Lock(), clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = threads or Threads()
        self._tasks: set[asyncio.Task[Any]] = set()  # of the calls started (on the loop)
        #: The call each task on the loop works for: its own, or the one of the task that
        #: created it (a perform's gather or create_task).
        self._calls: weakref.WeakKeyDictionary[asyncio.Future[Any], OnLoop] = (
            weakref.WeakKeyDictionary()
        )

    def run(
        self, make: Callable[[], Awaitable[Any]], time_limit: float | None, where: OnLoop
    ) -> None:
        """Run ``make()`` on the loop and wait for it (in the calling thread), noting
        ``where`` it is; raises what it raised, :class:`TimeLimitExceeded` when cancelled
        at ``time_limit``."""
        loop = self._started()

        async def own() -> BaseException | None:
            where.task = task = cast("asyncio.Task[Any]", asyncio.current_task())
            where.stuck_from = self._clock() + (time_limit or 0) + STUCK_SECONDS
            self._tasks.add(task)
            self._calls[task] = where
            try:
                await make()
            except TimeoutError as exc:  # perform's own (a call of its timed out): returned,
                return exc  # so that only the time limit's reads as the time limit
            finally:
                self._tasks.discard(task)
            return None

        async def call() -> BaseException | None:
            try:
                if time_limit is None:
                    return await own()
                return await asyncio.wait_for(own(), time_limit)
            except TimeoutError:
                raise TimeLimitExceeded(f"perform ran longer than {time_limit} s") from None
            except (SystemExit, KeyboardInterrupt) as exc:  # they would stop the loop
                return exc

        where.waiting = True
        try:
            escaped = asyncio.run_coroutine_threadsafe(call(), loop).result()
        finally:
            where.waiting, where.task = False, None
        if escaped is not None:
            raise escaped  # here, in the job's thread: a failed attempt, as for a sync job

    def holds_up(self, where: OnLoop) -> bool:
        """Whether a call holds its thread up itself: it is not on the loop, or it started
        and the loop is not running another call (one that does not yield holds up those
        waiting behind it, started or not), and ran its limit and STUCK_SECONDS since it
        started (one that started late behind another has its whole limit)."""
        task, loop = where.task, self._loop
        if not where.waiting:
            return True
        if loop is None or task not in self._tasks:  # not started, or just ended
            return False
        if self._clock() < where.stuck_from:
            return False
        running = asyncio.current_task(loop)
        call = self._calls.get(running) if running is not None else None
        return call is where or call is None or call.task not in self._tasks

    def close(self) -> None:
        """Stop the loop (an await still running is abandoned, as a sync job past the
        grace period is)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _task(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        """A task on the loop, working for the call of the task that creates it."""
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        parent = asyncio.current_task(loop)
        if parent is not None and parent in self._calls:
            self._calls[task] = self._calls[parent]
        return task

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = self._loop = asyncio.new_event_loop()
                loop.set_task_factory(self._task)

                def run() -> None:
                    try:
                        loop.run_forever()
                    finally:
                        loop.close()  # stopped: free its selector and pipe

                self._threads.start("shardq-async", "the event loop of async workers", run)
            return self._loop


class Performer:
    """Calls workers' ``perform`` for a node (any thread)."""

    def __init__(self, limits: TimeLimits, middleware: Sequence[Middleware], clock: Clock) -> None:
        self._limits, self._clock = limits, clock
        self._middleware = middleware  # the app's list: middleware added later counts
        #: The event loop of async workers (started on first use).
        self.loop = EventLoop(limits.threads, clock)

    def __call__(
        self,
        worker: WorkerLike,
        settings: WorkerSettings,
        entity: str,
        payloads: list[Any],
        jobs: list[JobInfo],
    ) -> tuple[BaseException | None, float]:
        """``worker.perform(entity, payloads)``: (the error or None, seconds it took)."""
        worker.jobs, worker.attempt = jobs, jobs[0].attempt
        # on the node's loop, limited by cancellation there
        is_coroutine = inspect.iscoroutinefunction(type(worker).perform)
        where = OnLoop()

        def call() -> None:
            if is_coroutine:
                self.loop.run(
                    lambda: cast(Awaitable[None], worker.perform(entity, payloads)),
                    settings.time_limit,
                    where,
                )
            else:
                result = worker.perform(entity, payloads)
                if inspect.isawaitable(result):  # async behind a plain decorator
                    self.loop.run(lambda: result, settings.time_limit, where)

        if self._middleware:
            ids, metas = [j.message_id for j in jobs], [j.meta for j in jobs]
            ctx = PerformContext(settings.name, entity, payloads, worker.attempt, ids, metas)
            inner = call

            def call() -> None:
                run_around(self._middleware, "around_perform", inner, ctx)

        limit, about = settings.time_limit, None
        if limit is not None:  # what job.stuck names
            ids = [j.message_id for j in jobs]
            about = {
                "worker": settings.name,
                "entity": entity,
                "time_limit": limit,
                "message_ids": ids,
            }
        started = self._clock()  # the node's: the slots decide by durations (run_inline)
        try:
            holds_up = functools.partial(self.loop.holds_up, where)
            _, overran = self._limits.run(
                call, limit, about, interrupt=not is_coroutine, holds_up=holds_up
            )
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: a failed attempt too
            return exc, self._clock() - started
        duration = self._clock() - started
        if overran:
            return TimeLimitExceeded(f"perform ran longer than {settings.time_limit} s"), duration
        return None, duration
