"""The command line's entry point, and its first moments.

``shardq run`` may get SIGTERM while Python is still importing shardq (an orchestrator
that scales in right after it scaled out). The handler is installed here, before
anything heavy is imported, so such a node stops cleanly (exit 0, nothing lost)
instead of dying of the signal. Only ``run`` gets it: other commands keep the usual
Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

#: The signals that stop a node gracefully: SIGTERM (orchestrators), SIGINT (Ctrl-C) and
#: SIGHUP (its terminal or SSH session went away).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


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


def entry() -> int:
    """``shardq ...`` and ``python -m shardq ...``."""
    argv = sys.argv[1:]
    early = EarlyStop() if argv[:1] == ["run"] else None
    from shardq.cli import main  # the heavy imports come after the handler

    return main(argv, early=early)
