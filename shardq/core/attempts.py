"""Which attempt a job's next run is: its receive count, less receives that ended without
a run, plus local retries (docs/design/core.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from shardq.core.messages import Message

#: Counts kept at most (ids of jobs finished elsewhere are dropped past this).
MAX_TRACKED = 100_000


class Attempts:
    """Attempt bookkeeping by message id: what to add to its receive count. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._corrections: dict[str, int] = {}

    def of(self, message: Message) -> int:
        """The 1-based attempt the next run of this message is."""
        correction = self._corrections.get(message.message_id, 0)
        return max(1, message.receive_count + correction)

    def unstarted(self, messages: Iterable[Message]) -> None:
        """These receives end without a run."""
        self._add(-1, messages)

    def local(self, messages: Iterable[Message]) -> None:
        """These jobs run again without a receive (a local retry)."""
        self._add(1, messages)

    def forget(self, messages: Iterable[Message]) -> None:
        """These jobs ended (succeeded or morgued)."""
        if not self._corrections:  # most runs: nothing to forget
            return
        with self._lock:
            for m in messages:
                self._corrections.pop(m.message_id, None)

    def _add(self, delta: int, messages: Iterable[Message]) -> None:
        with self._lock:
            if len(self._corrections) > MAX_TRACKED:
                self._corrections.clear()
            for m in messages:
                self._corrections[m.message_id] = self._corrections.get(m.message_id, 0) + delta
