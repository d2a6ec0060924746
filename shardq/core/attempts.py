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
    """Attempt bookkeeping by message id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unstarted: dict[str, int] = {}
        self._local: dict[str, int] = {}

    def of(self, message: Message) -> int:
        """The 1-based attempt the next run of this message is."""
        if not (self._unstarted or self._local):  # most runs: nothing to correct
            return max(1, message.receive_count)
        key = message.message_id
        with self._lock:
            count = message.receive_count - self._unstarted.get(key, 0) + self._local.get(key, 0)
        return max(1, count)

    def unstarted(self, messages: Iterable[Message]) -> None:
        """These receives end without a run."""
        self._add(self._unstarted, messages)

    def local(self, messages: Iterable[Message]) -> None:
        """These jobs run again without a receive (a local retry)."""
        self._add(self._local, messages)

    def forget(self, messages: Iterable[Message]) -> None:
        """These jobs ended (succeeded or morgued)."""
        if not (self._unstarted or self._local):
            return
        with self._lock:
            for m in messages:
                self._local.pop(m.message_id, None)
                self._unstarted.pop(m.message_id, None)

    def _add(self, counts: dict[str, int], messages: Iterable[Message]) -> None:
        with self._lock:
            if len(self._unstarted) + len(self._local) > MAX_TRACKED:
                self._unstarted.clear()
                self._local.clear()
            for m in messages:
                counts[m.message_id] = counts.get(m.message_id, 0) + 1
