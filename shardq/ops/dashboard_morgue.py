"""The dashboard's morgue API: a page of dead jobs (:func:`morgue_page`), and requeue or
purge of a selection (:func:`morgue_act`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import structlog

from shardq.api.app import App
from shardq.morgue import REASON_UNREADABLE, Filter, Morgue, MorgueRecord, payload_of
from shardq.ops.selection import DONE, Selection, SelectionError, act, parse_range

log = structlog.get_logger("shardq.dashboard")

MAX_RAW = 4000  # characters of an unreadable record shown
MAX_LIMIT = 1000
ACTIONS = {("POST", "requeue"), ("POST", "purge")}  # besides GET of a page


class HttpError(Exception):
    """An answer other than 200: its status, and the ``Allow`` header of a 405."""

    def __init__(self, status: int, message: str, allow: str | None = None) -> None:
        super().__init__(message)
        self.status, self.allow = status, allow


def morgue_page(app: App, worker: str, query: dict[str, list[str]]) -> dict[str, Any]:
    """``{"jobs": [...], "next": CURSOR or None, "size": N}``: the page of ``worker``'s
    dead jobs the query's search, ``limit`` and ``after`` cursor select."""
    morgue = Morgue(app, worker)
    page = morgue.page(_filter(query), _int_param(query, "limit", 100), _param(query, "after"))
    jobs = _records_json([_record_dict(r, app.signing_key) for r in page.records])
    return {"jobs": jobs, "next": page.next, "size": morgue.size()}


def morgue_act(
    app: App, worker: str, action: str, body: Callable[[], Any], lock: threading.Lock
) -> dict[str, int]:
    """Requeue or purge what the body (read once the worker is known) selects, one
    action at a time under ``lock``: ``{"requeued": N}`` or ``{"purged": N}``."""
    morgue = Morgue(app, worker)
    try:
        selection = Selection.from_body(body())
    except SelectionError as exc:
        raise HttpError(400, str(exc)) from None
    with lock:
        n = act(app, morgue.worker, action, selection)
    log.info(f"dashboard.morgue_{action}", worker=morgue.worker, scope=selection.scope(), count=n)
    return {DONE[action]: n}


def _record_dict(record: MorgueRecord, key: bytes | None) -> dict[str, Any]:
    """A dead job as the API shows it. A record that is not a shardq morgue record, or
    whose job body cannot be read, is ``unreadable`` and shows its ``raw`` text."""
    payload = payload_of(record, key)
    unreadable = record.reason == REASON_UNREADABLE or payload is None
    raw = record.body[:MAX_RAW] if unreadable else None
    return {**record.__dict__, "payload": payload, "unreadable": unreadable, "raw": raw}


def _records_json(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs``, with any job whose payload JSON cannot carry (NaN, nested too deeply)
    shown as unreadable instead."""
    try:
        json.dumps(docs, allow_nan=False)
        return docs
    except (ValueError, RecursionError):
        pass
    for doc in docs:
        try:
            json.dumps(doc["payload"], allow_nan=False)
        except (ValueError, RecursionError):
            doc.update(payload=None, unreadable=True, raw=doc["body"][:MAX_RAW])
    return docs


def _param(query: dict[str, list[str]], name: str) -> str | None:
    return query.get(name, [""])[-1] or None


def _filter(query: dict[str, list[str]]) -> Filter:
    """The morgue listing's search: entity, error type, time range."""
    try:
        since, until = parse_range(_param(query, "since"), _param(query, "until"))
    except SelectionError as exc:
        raise HttpError(400, str(exc)) from None
    return Filter(_param(query, "entity"), _param(query, "error_type"), since, until)


def _int_param(query: dict[str, list[str]], name: str, default: int) -> int:
    text = query.get(name, [str(default)])[-1]
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise HttpError(400, f"{name} must be between 1 and {MAX_LIMIT}, got {value}")
    return value
