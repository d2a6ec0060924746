"""The command line's first moments: ``shardq run`` may get SIGTERM while Python still
imports shardq, so its handler is installed before anything heavy (only for ``run``)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from shardq.core.signals import STOP_SIGNALS


class EarlyStop:
    """Signal handlers for the moments before the node installs its own: the first
    SIGTERM/SIGINT/SIGHUP is remembered (the node then stops at once, exit 0), a second one
    exits at once."""

    def __init__(self) -> None:
        self.signals = 0
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signals += 1
        if self.signals > 1:
            os._exit(128 + signum)
