"""A node's threads, one owner: the threads of its parts (lanes, slots, the lease keeper,
the idle watch, the fleet, the layout keeper, ...) are started here under a name and
guarded. A thread that raises is reported to the node at once (it stops, exit
code 1), so no part dies unnoticed; at shutdown :meth:`Threads.left` names those still
running. See docs/design/run.md.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from queue import Empty, SimpleQueue

import structlog

log = structlog.get_logger("shardq.node")


def describe(exc: BaseException) -> str:
    """``Type: message``; the type alone if the exception cannot say its message."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _logged(what: str, exc: BaseException) -> None:
    log.error("node.part_failed", part=what, error=describe(exc), exc_info=exc)


class Threads:
    """Starts and guards threads; ``on_failure(what, exc)`` is called in the thread that
    raised ``exc`` (default: logged)."""

    def __init__(self, on_failure: Callable[[str, BaseException], None] = _logged) -> None:
        self.fail = on_failure
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._prune_at = 64

    def start(self, name: str, what: str, run: Callable[[], None]) -> threading.Thread:
        """Run ``run`` on a daemon thread ``name``, started; an exception out of it goes
        to :attr:`fail` with ``what``, the part's name for people ("the lease keeper")."""

        def guarded() -> None:
            try:
                run()
            except BaseException as exc:
                try:
                    self.fail(what, exc)
                except BaseException as again:  # the handler failed too: still say so
                    _logged(f"{what} (its failure handler raised {describe(again)})", exc)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        with self._lock:
            if len(self._threads) >= self._prune_at:  # drop ended ones (not unstarted ones)
                self._threads = [t for t in self._threads if t.ident is None or t.is_alive()]
                self._prune_at = max(64, 2 * len(self._threads))
            self._threads.append(thread)
        thread.start()
        return thread

    def left(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` real seconds for every thread to end; the names of
        those still running, in start order."""
        with self._lock:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        deadline = time.monotonic() + timeout
        for thread in threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in threads if t.is_alive()]


def side_by_side(
    calls: Sequence[Callable[[], object]],
    parallel: int,
    between: Callable[[], None] = lambda: None,
    until: threading.Event | None = None,
    every: float = 1.0,
) -> None:
    """Make ``calls`` (requests, mostly) ``parallel`` at a time, each in a daemon thread
    (a call stuck at exit does not hold the process), ``between`` before each is begun
    and at least every ``every`` seconds while they run; none is begun once ``until`` is
    set, or once one raised: its error is raised here after those under way ended (an
    error of ``between``: after they ended or 5 ``every``s, their own errors lost)."""
    if parallel < 1:
        raise ValueError(f"parallel must be 1 or more, not {parallel}")
    todo, ended = deque(calls), SimpleQueue[BaseException | None]()
    running, error = 0, None
    try:
        while todo or running:
            between()
            if error is not None or (until is not None and until.is_set()):
                todo.clear()
            while todo and running < parallel:
                call = todo.popleft()
                threading.Thread(
                    target=_run, args=(call, ended), name="shardq-side", daemon=True
                ).start()
                running += 1
            if not running:
                break
            try:
                outcome = ended.get(timeout=every)
            except Empty:
                continue
            running -= 1
            if error is None:
                error = outcome
    finally:  # ``between`` raised: the calls under way end first (or 5 ``every``s pass)
        deadline = time.monotonic() + 5 * every
        for _ in range(running):
            with suppress(Empty):
                ended.get(timeout=max(0.0, deadline - time.monotonic()))
    if error is not None:
        raise error


def _run(call: Callable[[], object], ended: SimpleQueue[BaseException | None]) -> None:
    try:
        call()
    except BaseException as exc:  # raised by side_by_side in its caller's thread
        ended.put(exc)
    else:
        ended.put(None)
