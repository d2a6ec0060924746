"""Which dead jobs a requeue or purge acts on: said exactly, or refused."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.morgue import Filter
from shardq.ops.selection import (
    SelectionError,
    cursor,
    from_args,
    from_body,
    parse_time,
    scope,
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"all": True}, Filter()),
        ({"entity": "o1"}, Filter(entity="o1")),
        ({"message_ids": ["a", "b"]}, Filter(message_ids=frozenset({"a", "b"}))),
        ({"entity": "o1", "message_ids": ["a"]}, Filter("o1", message_ids=frozenset({"a"}))),
        ({"message_ids": []}, Filter(message_ids=frozenset())),
    ],
)
def test_a_body_that_says_which_jobs_is_read_as_said(body: Any, expected: Filter) -> None:
    assert from_body(body) == expected


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"entitiy": "o1"}, "unknown key 'entitiy'"),
        ({"entity": "o1", "ids": ["a"]}, "unknown key 'ids'"),
        ({}, "say which dead jobs"),
        ([], "must be a JSON object"),
        (None, "must be a JSON object"),
        ({"all": False}, '"all" must be true'),
        ({"all": 1}, '"all" must be true'),
        ({"all": True, "entity": "o1"}, "alone"),
        ({"all": True, "message_ids": []}, "alone"),
        ({"entity": ""}, "non-empty string"),
        ({"entity": None}, "say which dead jobs"),
        ({"message_ids": "a"}, "list of non-empty strings"),
        ({"message_ids": [1]}, "list of non-empty strings"),
    ],
)
def test_anything_else_is_refused_with_the_reason(body: Any, reason: str) -> None:
    with pytest.raises(SelectionError, match=reason.replace("(", r"\(")):
        from_body(body)


def test_the_command_line_needs_all_to_act_on_every_job() -> None:
    assert scope(from_args(None, None, True)) == " (all of them)"
    assert scope(from_args("o1", ["a"], False)) == " of entity o1 with ids a"
    with pytest.raises(SelectionError, match="--all"):
        from_args(None, None, False)
    with pytest.raises(SelectionError, match="alone"):
        from_args("o1", None, True)


@pytest.mark.parametrize("when", ["nan", "inf", "-Infinity", float("nan"), float("inf"), 1e400])
def test_a_time_that_is_not_finite_is_refused(when: Any) -> None:
    # given since or until as NaN or infinity (text on the command line, a number in JSON,
    # where 1e400 reads as infinity), which would match no dead job or every one
    # then the selection is refused naming the key, before anything is changed
    with pytest.raises(SelectionError, match=r"since .* is not a time"):
        from_body({"since": when})
    with pytest.raises(SelectionError, match=r"--until .* is not a time"):
        parse_time("--until", when)


def test_unix_seconds_and_ages_are_still_read() -> None:
    assert parse_time("--since", "1700000000.5") == 1700000000.5
    assert parse_time("--since", 1700000000) == 1700000000.0
    assert parse_time("--since", "30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_time("--since", "2026-11-27T08:00:00Z") == 1795766400.0


@pytest.mark.parametrize("when", ["1e20", -1e20, "99999999999d", 253402300800])
def test_a_time_no_date_can_show_is_refused(when: Any) -> None:
    # given since or until far beyond year 9999 or before year 1 (a huge unix time or age)
    # then the selection is refused naming the key, before anything is changed (such a
    # time matched every dead job, then failed to print once they had been requeued)
    with pytest.raises(SelectionError, match=r"--until .* is not a time"):
        parse_time("--until", when, now=1_800_000_000.0)
    with pytest.raises(SelectionError, match=r"since .* is not a time"):
        from_body({"since": when})


def test_a_cursor_a_listing_printed_is_read_and_anything_else_refused() -> None:
    # given the cursors a listing prints (of all dead jobs, or of one entity's)
    for printed in ("01795795402255833884668e4f/e-14", "01795795402316920690856dd2", None):
        assert cursor(printed) == printed
    # when a cursor is mistyped, cut short or made up
    # then it is refused naming it: it listed nothing, or from the start, without a word
    for bad in ("garbage", "", "0179579540225583", "01795795402255833884668e4f/", "zz/zz"):
        with pytest.raises(SelectionError, match=r"is not a cursor .* printed"):
            cursor(bad)
