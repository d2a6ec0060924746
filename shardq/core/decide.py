"""What becomes of a failed ``perform``: retry after a delay, or the morgue. Pure
functions of the error, the attempt and the worker's settings; the executor carries
them out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from shardq.core.errors import Retry
from shardq.core.limits import MAX_VISIBILITY_SECONDS

#: Why a job is in the morgue.
REASON_MAX_RETRIES = "max_retries"
REASON_PERMANENT = "permanent_error"
REASON_INVALID = "invalid_message"
REASON_UNKNOWN_WORKER = "unknown_worker"
#: Not written by shardq: a stored record it cannot read (listed, never requeued).
REASON_UNREADABLE = "unreadable_record"


RETRY = "retry"
MORGUE = "morgue"

#: Longest fallback delay, when ``retry_in`` fails or the morgue is unreachable.
FALLBACK_CAP_SECONDS = 60.0


@dataclass(frozen=True)
class Decision:
    """``action`` is :data:`RETRY` (after ``delay`` seconds) or :data:`MORGUE` (``reason``)."""

    action: str
    delay: float = 0.0
    reason: str = ""
    #: Set when the worker's ``retry_in`` raised: the delay is the fallback backoff.
    retry_in_failed: bool = False


@dataclass(frozen=True)
class Rules:
    """The parts of a worker's settings that decide a failure."""

    max_retries: int
    permanent_errors: tuple[type[BaseException], ...]
    retry_in: Callable[[int], float]
    #: Cap on every retry delay (``shardq.ops.testing.drain`` uses 0: retry at once).
    max_delay: float | None = None


def backoff(attempt: int) -> float:
    """The fallback delay after failed attempt ``attempt``: 2**attempt s, at most 60 s."""
    return min(FALLBACK_CAP_SECONDS, 2.0 ** min(max(attempt, 0), 16))


def decide(error: BaseException, attempt: int, rules: Rules, now: float) -> Decision:
    """The decision for a ``perform`` that raised ``error`` on attempt ``attempt``
    (1 = first run); ``now`` is the wall-clock time (for ``Retry(at=...)``)."""
    if isinstance(error, rules.permanent_errors):
        return Decision(MORGUE, reason=REASON_PERMANENT)
    if attempt > rules.max_retries:
        return Decision(MORGUE, reason=REASON_MAX_RETRIES)
    failed = False
    delay = _asked_delay(error, now)
    if delay is None:
        try:
            delay = float(rules.retry_in(attempt))
        except BaseException:  # a user's hook: whatever it raises, the fallback
            delay, failed = backoff(attempt), True
        if delay != delay:  # NaN from a user's retry_in
            delay, failed = backoff(attempt), True
    delay = min(max(0.0, delay), float(MAX_VISIBILITY_SECONDS))
    if rules.max_delay is not None:
        delay = min(delay, rules.max_delay)
    return Decision(RETRY, delay=delay, retry_in_failed=failed)


def _asked_delay(error: BaseException, now: float) -> float | None:
    """The delay a ``Retry`` exception asks for, or None to use ``retry_in``."""
    if not isinstance(error, Retry):
        return None
    if error.at is None:
        return None if error.delay is None else float(error.delay)
    at = error.at.timestamp() if isinstance(error.at, dt.datetime) else error.at
    return float(at) - now
