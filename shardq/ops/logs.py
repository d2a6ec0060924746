"""Structured logs (structlog): readable on a terminal, one JSON object per line in
production; payloads are never logged at info level. The CLI calls :func:`configure`."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog. ``fmt``: ``console``, ``json`` or ``auto`` (console on a tty)."""
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
