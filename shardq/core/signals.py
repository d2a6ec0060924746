"""The signals that stop a node gracefully (SIGTERM, SIGINT, SIGHUP) and their handler,
installed by :mod:`shardq.__main__` early and taken over by the node."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


class StopSignals:
    """Counts stop signals: the first sets ``stopping``, a second exits at once."""

    def __init__(self, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.count = 0
        self.name: str | None = None

    def install(self, before: int = 0) -> None:
        """Handle them from now on (in the main thread only), counting ``before``
        signals that came earlier."""
        self.count = before
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:  # SIGTERM, SIGINT and SIGHUP
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Only flags: logging or a lock here could deadlock with the interrupted code.
        self.count += 1
        if self.count > 1:
            os._exit(128 + signum)
        self.name = signal.Signals(signum).name
        self.stopping.set()
