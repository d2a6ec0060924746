"""``async def perform``: one event loop per node, in its own thread.

A worker whose ``perform`` is a coroutine function is run on the node's loop
(:class:`EventLoop`); the execution slot that runs the entity waits for it, so async
and sync jobs share the node's ``concurrency`` and the same order, retry, morgue and
shutdown rules. A ``time_limit`` is enforced by real cancellation
(:func:`asyncio.wait_for`): the coroutine gets :class:`asyncio.CancelledError` at its
current ``await``, and the call fails with
:class:`~shardq.run.timelimit.TimeLimitExceeded`. A ``CancelledError`` (or any other
``BaseException``) that ``perform`` raises itself is a failed attempt.

Keep the loop free: a blocking call inside an async ``perform`` (``time.sleep``, a
synchronous HTTP client) stalls every async job of the node.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from shardq.run.timelimit import TimeLimitExceeded


def is_async(perform: Callable[..., Any]) -> bool:
    """Is this ``perform`` a coroutine function (``async def``)?"""
    return inspect.iscoroutinefunction(perform)


class EventLoop:
    """The node's event loop for async workers, started on first use. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, make: Callable[[], Awaitable[Any]], time_limit: float | None) -> None:
        """Run ``make()`` on the loop and wait for it (in the calling thread); raises
        what it raised, :class:`TimeLimitExceeded` when cancelled at ``time_limit``."""
        loop = self._started()

        async def call() -> None:
            if time_limit is None:
                await make()
                return
            try:
                await asyncio.wait_for(make(), time_limit)
            except TimeoutError:
                raise TimeLimitExceeded(f"perform ran longer than {time_limit} s") from None

        asyncio.run_coroutine_threadsafe(call(), loop).result()

    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive()

    def close(self) -> None:
        """Stop the loop (an await still running is abandoned, as a sync job past the
        grace period is: its message reappears after its visibility timeout)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="shardq-async", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop
