"""Signals that ask a process to stop (SIGTERM, SIGINT, SIGHUP) and their one handler:
installed by :mod:`shardq.__main__` early and taken over by the node; the dashboard and
``publish --file`` use it too."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


def exit_now(signum: int) -> None:
    """Leave the process at once, with the code a shell reports for that signal."""
    os._exit(128 + signum)


class StopSignals:
    """Counts ``signals``: the first sets ``stopping``; a second calls ``again`` (by
    default :func:`exit_now`)."""

    def __init__(
        self,
        stopping: threading.Event,
        signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
        again: Callable[[int], None] = exit_now,
    ) -> None:
        self.stopping, self.signals, self.again = stopping, signals, again
        self.count = 0
        self.name: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self, before: int = 0) -> None:
        """Handle them from now on (in the main thread only), counting ``before``
        signals that came earlier."""
        self.count = before
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        while self._previous:
            sig, handler = self._previous.popitem()
            if handler is not None:  # None: a handler not set from Python, left as is
                signal.signal(sig, handler)

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        self.install()
        try:
            yield self
        finally:
            self.restore()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only flags: logging or a lock here could deadlock with the interrupted code.
        self.count += 1
        if self.count > 1:
            self.again(signum)
            return
        self.name = signal.Signals(signum).name
        self.stopping.set()
