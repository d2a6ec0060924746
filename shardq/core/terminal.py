"""What the commands print for people: counted nouns and a progress line."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 job``, ``2 jobs`` (``nouns`` for irregular plurals)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


class Progress:
    """A line on stderr rewritten in place as work advances, only on a terminal; call it
    with the count done so far. Used as a context manager, it erases the line at the end."""

    def __init__(
        self, verb: str, total: int | None = None, *, stream: TextIO | None = None
    ) -> None:
        self.verb, self.total = verb, total
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.enabled = self.stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            self.enabled = False
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        of = f" of {self.total:,}" if self.total is not None else ""
        self.stream.write(f"\r  {self.verb} {done:,}{of}...\033[K")
        self.stream.flush()
        self._shown = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
