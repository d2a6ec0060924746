"""Which dead jobs a requeue or purge acts on, said the same way by the JSON API and the
``shardq morgue`` options; "all" only when said explicitly, anything unclear refused."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import time
from typing import Any

from shardq.api.app import App
from shardq.core.errors import ShardqError
from shardq.morgue import Filter, Morgue, Progress, Refused
from shardq.morgue.record import STAMP_DIGITS

#: The most dead jobs one listing shows.
MAX_LIST = 100_000

BODY_FORMS = (
    '{"message_ids": [...]}, {"entity": "..."}, {"error_type": "..."}, {"since": TIME, '
    '"until": TIME}, several of them, or {"all": true}'
)
ARG_FORMS = "--entity ID, --id MESSAGE_ID, --error-type T, --since/--until TIME, or --all"
TIME_FORMS = (
    "a UTC time such as 2026-11-25T14:00:00 (or with a +01:00 offset), a unix time, or an "
    "age such as 90s, 30m, 6h, 7d"
)
_FILTERS = ("entity", "message_ids", "error_type", "since", "until")


class SelectionError(ShardqError, ValueError):
    """A requeue or purge does not say exactly which dead jobs: nothing was changed."""


def parse_time(name: str, text: Any, now: float | None = None) -> float:
    """``--since``/``--until``: an ISO 8601 time (UTC unless it says), unix seconds, or
    an age (``30m`` ago); anything else is refused naming the option."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not math.isfinite(text):  # NaN would match no job, inf every one
            raise SelectionError(f"{name} {text!r} is not a time: give {TIME_FORMS}")
        return _datable(name, text, float(text))
    if not isinstance(text, str):
        raise SelectionError(f"{name} must be {TIME_FORMS}")
    age = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if age:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        return _datable(
            name, text, (time.time() if now is None else now) - float(age.group(1)) * unit
        )
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return parse_time(name, seconds, now)  # unix seconds, but never "nan" or "inf"
    try:
        at = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SelectionError(f"{name} {text!r} is not a time: give {TIME_FORMS}") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.timezone.utc)
    return _datable(name, text, at.timestamp())


def _datable(name: str, text: Any, unix: float) -> float:
    """``unix`` if it is a date from year 1 to 9999 (one every message can show), else
    refused naming the option: a later one matched every dead job."""
    try:
        dt.datetime.fromtimestamp(unix, dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise SelectionError(f"{name} {text!r} is not a time: give {TIME_FORMS}") from None
    return unix


def parse_range(since: Any, until: Any, prefix: str = "") -> tuple[float | None, float | None]:
    """``since`` and ``until`` (None: open) as Unix times; errors name ``prefix`` + the key."""
    return (
        None if since is None else parse_time(f"{prefix}since", since),
        None if until is None else parse_time(f"{prefix}until", until),
    )


def cursor(text: str | None) -> str | None:
    """``--after`` (``after``): a cursor a listing printed, or None; anything else is
    refused (it would list nothing, or from the start, without a word)."""
    if text is None or re.fullmatch(rf"\d{{{STAMP_DIGITS}}}[0-9a-f]{{6}}(/[^/]+)?", text):
        return text
    raise SelectionError(
        f"after {text!r} is not a cursor a listing printed: copy it whole from "
        "'the next page is --after CURSOR' (or the API's \"next\")"
    )


#: The past tense of each action, as answers and messages say it.
DONE = {"requeue": "requeued", "purge": "purged"}
EVERYTHING = Filter()  # every dead job of the worker: only ever said explicitly


def from_body(doc: Any) -> Filter:
    """The dead jobs a JSON API body such as ``{"entity": "order-42"}`` or ``{"all": true}``
    selects."""
    if not isinstance(doc, dict):
        raise SelectionError(f"the request body must be a JSON object: {BODY_FORMS}")
    unknown = sorted(set(doc) - {"all", *_FILTERS})
    if unknown:
        raise SelectionError(
            f"unknown key {', '.join(map(repr, unknown))}: nothing was changed; send {BODY_FORMS}"
        )
    if "all" in doc and doc["all"] is not True:
        raise SelectionError(f'"all" must be true, got {json.dumps(doc["all"])[:40]}')
    return _checked(BODY_FORMS, "", "all" in doc, {k: doc.get(k) for k in _FILTERS})


def from_args(
    entity: str | None,
    ids: list[str] | None,
    everything: bool,
    error_type: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Filter:
    """The dead jobs the options of ``shardq morgue requeue|purge`` select."""
    given = dict(zip(_FILTERS, (entity, ids, error_type, since, until), strict=True))
    return _checked(ARG_FORMS, "--", everything, given)


def _checked(forms: str, prefix: str, everything: bool, given: dict[str, Any]) -> Filter:
    """Refuse anything unclear; ``forms`` says what may be given, ``prefix`` + a key names
    a time that cannot be read."""
    for key in ("entity", "error_type"):
        if given[key] is not None and not (isinstance(given[key], str) and given[key]):
            raise SelectionError(f"{key} must be a non-empty string")
    ids = given["message_ids"]
    if ids is not None and not (
        isinstance(ids, list) and all(isinstance(i, str) and i for i in ids)
    ):
        raise SelectionError("message_ids must be a list of non-empty strings")
    since, until = parse_range(given["since"], given["until"], prefix)
    if since is not None and until is not None and since > until:
        raise SelectionError("since is later than until: nothing can match")
    if everything and any(v is not None for v in given.values()):
        raise SelectionError("all means every dead job: give it alone, not with filters or ids")
    if not everything and all(v is None for v in given.values()):
        raise SelectionError(f"say which dead jobs: {forms}; nothing was changed")
    ids = None if ids is None else frozenset(ids)
    return Filter(given["entity"], given["error_type"], since, until, ids)


def unmatched(where: Filter, seen: set[str]) -> list[str]:
    """The ids given in ``where`` that name no dead job it selected (none if no ids),
    ``seen`` holding those :func:`act` found: a requeue or purge must not pass them for
    done."""
    return sorted((where.message_ids or frozenset()) - seen)


def scope(where: Filter) -> str:
    """`` of entity order-42``, `` with ids a, b`` or `` (all of them)``."""
    return " (all of them)" if where == EVERYTHING else where.describe()


def act(
    app: App,
    worker: str,
    action: str,
    where: Filter,
    progress: Progress | None = None,
    refused: Refused | None = None,
    seen: set[str] | None = None,
) -> int:
    """Requeue or purge (``action``) the selected dead jobs of ``worker``; how many.
    ``refused`` hears of each dead job that cannot be requeued (it stays); ``seen`` gets
    the ids of each one selected."""
    if where.message_ids == frozenset():  # an empty list of ids names no job
        return 0
    morgue = Morgue(app, worker)
    if action == "requeue":
        return morgue.requeue(where, progress, refused, seen)
    return morgue.purge(where, progress, seen)
