"""Plain-text tables and values for the operations commands."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence


def table(rows: Sequence[tuple[str, ...]], align: str = "") -> str:
    """``rows`` (the first is the header) in aligned columns; ``align``: ``l`` or ``r``
    per column (default: the first left, the others right)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    align = align or "l" + "r" * (len(widths) - 1)
    return "\n".join(
        "  ".join(
            c.ljust(w) if align[i] == "l" else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    )


def age(seconds: float | None) -> str:
    """A duration in a unit that reads well (``-`` when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def optional(value: int | None) -> str:
    return "-" if value is None else str(value)


def utc(unix: float) -> str:
    """A Unix time in UTC, ``2025-01-31 12:00:05``."""
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
