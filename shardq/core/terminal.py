"""What the commands print for people: counted nouns and a progress line."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 job``, ``2 jobs`` (``nouns`` for irregular plurals)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


class Progress:
    """A line on stderr rewritten in place as work advances, shown only on a terminal.

    Use as a context manager and call it with the count done so far; the line is
    erased at the end, so the command's own summary follows on a clean line.
    """

    def __init__(
        self, verb: str, total: int | None = None, *, stream: TextIO | None = None
    ) -> None:
        self.verb, self.total = verb, total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream)
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

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
