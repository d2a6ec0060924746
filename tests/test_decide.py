"""The retry / morgue decision, with plain data (no broker, no node)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from shardq.core.decide import MORGUE, RETRY, Decision, Rules, backoff, decide
from shardq.core.errors import PermanentError, Retry
from shardq.core.limits import MAX_VISIBILITY_SECONDS

NOW = 1_700_000_000.0


class Fatal(Exception):
    pass


def rules(
    max_retries: int = 3,
    retry_in: Callable[[int], float] = lambda attempt: 10.0 * attempt,
    max_delay: float | None = None,
) -> Rules:
    return Rules(max_retries, (PermanentError, Fatal), retry_in, max_delay)


def broken_retry_in(attempt: int) -> float:
    raise ZeroDivisionError("bad backoff")


@pytest.mark.parametrize(
    ("error", "attempt", "given", "expected"),
    [
        # an ordinary failure with retries left: the worker's retry_in decides
        (RuntimeError("x"), 1, rules(), Decision(RETRY, delay=10.0)),
        (RuntimeError("x"), 3, rules(), Decision(RETRY, delay=30.0)),
        # the last retry used up: the morgue
        (RuntimeError("x"), 4, rules(), Decision(MORGUE, reason="max_retries")),
        (RuntimeError("x"), 1, rules(max_retries=0), Decision(MORGUE, reason="max_retries")),
        # a permanent error, or one the worker lists: the morgue at once
        (PermanentError("no"), 1, rules(), Decision(MORGUE, reason="permanent_error")),
        (Fatal("no"), 1, rules(), Decision(MORGUE, reason="permanent_error")),
        # Retry asks for its own delay; it still counts toward max_retries
        (Retry(delay=5), 2, rules(), Decision(RETRY, delay=5.0)),
        (Retry(delay=0), 1, rules(), Decision(RETRY, delay=0.0)),
        (Retry(), 2, rules(), Decision(RETRY, delay=20.0)),
        (Retry(delay=5), 4, rules(), Decision(MORGUE, reason="max_retries")),
        (Retry(at=NOW + 42), 1, rules(), Decision(RETRY, delay=42.0)),
        (Retry(at=NOW - 42), 1, rules(), Decision(RETRY, delay=0.0)),
        (
            Retry(at=dt.datetime.fromtimestamp(NOW + 7, tz=dt.timezone.utc)),
            1,
            rules(),
            Decision(RETRY, delay=7.0),
        ),
        # a retry_in that raises or answers nonsense falls back to the backoff
        (
            RuntimeError("x"),
            2,
            rules(retry_in=broken_retry_in),
            Decision(RETRY, delay=4.0, retry_in_failed=True),
        ),
        (
            RuntimeError("x"),
            3,
            rules(retry_in=lambda a: float("nan")),
            Decision(RETRY, delay=8.0, retry_in_failed=True),
        ),
        # delays are kept within 0 .. 12 h, and within the cap a drain sets
        (RuntimeError("x"), 1, rules(retry_in=lambda a: -3.0), Decision(RETRY, delay=0.0)),
        (
            RuntimeError("x"),
            1,
            rules(retry_in=lambda a: 1e9),
            Decision(RETRY, delay=float(MAX_VISIBILITY_SECONDS)),
        ),
        (RuntimeError("x"), 1, rules(max_delay=0.0), Decision(RETRY, delay=0.0)),
    ],
)
def test_decisions(error: BaseException, attempt: int, given: Rules, expected: Decision) -> None:
    # given a failure on some attempt under some rules / when decided / then
    assert decide(error, attempt, given, NOW) == expected


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff(a) for a in (0, 1, 2, 3, 5, 6, 100)] == [1, 2, 4, 8, 32, 60, 60]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"delay": "soon"}, "delay"),
        ({"delay": [5]}, "delay"),
        ({"delay": 10**400}, "delay"),
        ({"at": "Wed, 21 Oct 2026 07:28:00 GMT"}, "at"),
        ({"at": dt.date(2030, 1, 1)}, "at"),
        ({"at": ""}, "at"),
    ],
)
def test_a_retry_that_is_not_a_time_is_refused_where_it_is_raised(
    kwargs: dict[str, object], named: str
) -> None:
    # given a delay or time that is not seconds nor a datetime (a Retry-After header's
    # date, a date without a time) / when a Retry is made of it / then it is refused at
    # once, naming the argument, so the attempt fails as any other instead of failing
    # the decision (and the node) later
    with pytest.raises(ValueError, match=rf"^Retry\({named}=.*\) takes "):
        Retry(**kwargs)  # type: ignore[arg-type]


def test_a_retry_given_seconds_as_text_still_waits_them() -> None:
    assert decide(Retry(delay="30"), 1, rules(), NOW) == Decision(RETRY, delay=30.0)  # type: ignore[arg-type]
