"""The signals that stop a node gracefully: SIGTERM (orchestrators), SIGINT (Ctrl-C) and
SIGHUP (its terminal or SSH session went away)."""

import signal

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
