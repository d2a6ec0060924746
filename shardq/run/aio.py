"""``async def perform``: one event loop per node, in its own thread.

An async worker's calls share the node's ``concurrency`` and its order, retry and
shutdown rules; its ``time_limit`` cancels the coroutine (:func:`asyncio.wait_for`).
A blocking call inside an async ``perform`` stalls every async job of the node.
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
        grace period is)."""
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
