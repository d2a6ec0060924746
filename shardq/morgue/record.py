"""The morgue record: one dead job in the state store, and why it died. Its items, per
worker ``W``, ``ENC`` the percent-encoded entity id and ``STAMP`` the death time:
``morgue/W/t/STAMP/ENC`` (summary), ``morgue/W/e/ENC/STAMP`` (record and the body's first
piece), ``morgue/W/p/STAMP/K`` (the rest of a large body) and ``morgue/W/m/ID`` (naming
the summary of message ``ID``'s record); see docs/operations.md. :func:`bury` writes them."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, unquote

from shardq.broker.base import Message
from shardq.core.clock import wall
from shardq.core.decide import REASON_UNREADABLE
from shardq.store.base import DamagedItem, Item, Store, StoreConflict

KIND = "shardq.morgue"
VERSION = 3
MAX_TRACEBACK_CHARS = 8000
MAX_ERROR_MESSAGE_CHARS = 2000
MAX_ERROR_TYPE_CHARS = 200
SUMMARY_MESSAGE_CHARS = 200  # of the error message, in the summary item
MAX_META_BYTES = 16 * 1024  # largest JSON of meta kept in a record (the body has it anyway)
PIECE_BYTES = 300 * 1024  # JSON bytes of body per item (the store allows 350 KiB per value)
STAMP_DIGITS = 20
#: A death stamp: nanoseconds and six random hex digits (:func:`new_stamp`).
STAMP = re.compile(rf"[0-9]{{{STAMP_DIGITS}}}[0-9a-f]{{6}}")

_SUMMARY = ("entity_id", "message_id", "reason", "error_type", "attempts", "failed_at", "pieces")
#: The text fields of a record, in every version (the old morgue queue's too).
STRINGS = ("entity_id", "message_id", "reason", "error_type", "error_message", "traceback")


@dataclass(frozen=True)
class MorgueRecord:
    """A dead job: why it died and (once loaded) its original body."""

    entity_id: str
    message_id: str
    reason: str
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    attempts: int = 0
    #: When the node moved it to the morgue, and when it was first published (unix s).
    failed_at: float = 0.0
    first_sent_at: float = 0.0
    source_queue: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    body: str = ""
    body_bytes: int = 0  # these two: of a record read from the store
    body_sha256: str = ""
    pieces: int = 1  # items the body takes
    key: str = ""  # where it is stored (``morgue/W/e/ENC/STAMP``): its identity


def entity_key(entity: str) -> str:
    """The entity id as it appears in keys: no ``/``, and distinct ids stay distinct."""
    return quote(entity, safe="")


_stamp_lock = threading.Lock()
_last_stamp = [0]


def new_stamp(at: float | None = None) -> str:
    """A death stamp: the time ``at`` (default: now, rising within this process) in
    nanoseconds and six random hex digits."""
    if at is not None:
        return f"{stamp_for(at)}{secrets.token_hex(3)}"
    with _stamp_lock:
        ns = _last_stamp[0] = max(time.time_ns(), _last_stamp[0] + 1)
    return f"{ns:0{STAMP_DIGITS}d}{secrets.token_hex(3)}"


def stamp_for(at: float) -> str:
    """The smallest stamp of a death at unix time ``at`` (for time-range queries)."""
    return f"{max(0, int(at * 1e9)):0{STAMP_DIGITS}d}"


def record_for(
    message: Message,
    reason: str,
    error: BaseException,
    attempts: int,
    meta: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> MorgueRecord:
    """The record of a job that dies at Unix time ``now`` (default: now)."""
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return MorgueRecord(
        entity_id=message.group_id,
        message_id=message.message_id,
        reason=reason,
        error_type=type(error).__name__[:MAX_ERROR_TYPE_CHARS],
        error_message=str(error)[:MAX_ERROR_MESSAGE_CHARS],
        traceback=tb[-MAX_TRACEBACK_CHARS:],
        attempts=attempts,
        failed_at=wall() if now is None else now,
        first_sent_at=message.sent_at,
        source_queue=message.queue,
        meta=dict(meta or {}),
        body=message.body,
    )


def items(worker: str, record: MorgueRecord, stamp: str) -> list[tuple[str, dict[str, Any]]]:
    """The store items of a record, pieces of the body first, then the record, its id
    item (:func:`id_key`), the summary last (a burial writes the id item first)."""
    pieces = _split(record.body)
    meta = dict(record.meta)
    if len(json.dumps(meta, default=str)) > MAX_META_BYTES:
        meta = {"shardq_note": f"meta over {MAX_META_BYTES} bytes: see the job's body"}
    raw = record.body.encode("utf-8", "surrogatepass")
    full = {
        "kind": KIND,
        "v": VERSION,
        **{k: getattr(record, k) for k in STRINGS},
        **{k: getattr(record, k) for k in ("attempts", "failed_at", "first_sent_at")},
        "source_queue": record.source_queue,
        "meta": meta,
        "body_bytes": len(raw),
        "body_sha256": hashlib.sha256(raw).hexdigest(),
        "pieces": len(pieces),
        "body": pieces[0],
    }
    summary = {k: full[k] for k in _SUMMARY}
    summary["error_message"] = record.error_message[:SUMMARY_MESSAGE_CHARS]
    t, e, *rest = keys_of(f"morgue/{worker}/e/{entity_key(record.entity_id)}/{stamp}", len(pieces))
    out = [(key, {"body": p}) for key, p in zip(rest, pieces[1:], strict=True)]
    return [*out, (e, full), (id_key(worker, record.message_id), {"summary": t}), (t, summary)]


def id_key(worker: str, message_id: str) -> str:
    """The item naming the summary of job ``message_id``'s record: a burial looks it up."""
    return f"morgue/{worker}/m/{quote(message_id, safe='')}"


def stamp_of(key: object, worker: str, entity: str) -> str | None:
    """The stamp of ``key`` if it is the key of a summary of ``worker``'s dead job of
    ``entity`` (as an id item names it), else None."""
    if not isinstance(key, str):
        return None
    stamp = key.rsplit("/", 2)[-2] if key.count("/") >= 2 else ""
    ok = STAMP.fullmatch(stamp) is not None
    return stamp if ok and key == f"morgue/{worker}/t/{stamp}/{entity_key(entity)}" else None


def keys_of(key: str, pieces: int) -> list[str]:
    """Every key of the record whose summary or record item is at ``key``: summary,
    record, then the ``pieces - 1`` more of its body."""
    head, enc, stamp = _parse(key)
    parts = [f"{head}/p/{stamp}/{k:03d}" for k in range(1, pieces)]
    return [f"{head}/t/{stamp}/{enc}", f"{head}/e/{enc}/{stamp}", *parts]


def _parse(key: str) -> tuple[str, str, str]:
    """``morgue/W/e/ENC/STAMP`` or ``morgue/W/t/STAMP/ENC`` -> (``morgue/W``, ENC, STAMP)."""
    head, kind, a, b = key.rsplit("/", 3)
    return (head, a, b) if kind == "e" else (head, b, a)


def summary(item: Item) -> MorgueRecord:
    """A record from its summary or record item, without traceback, meta or body."""
    key = keys_of(item.key, 1)[1]
    try:
        v = checked(item.value, _SUMMARY)
        return MorgueRecord(
            **{k: v[k] for k in STRINGS[:4]},
            error_message=str(v.get("error_message", ""))[:SUMMARY_MESSAGE_CHARS],
            attempts=v["attempts"],
            failed_at=float(v["failed_at"]),
            pieces=pieces_of(v),
            key=key,
        )
    except ValueError as exc:
        return _unreadable_item(key, item.value, item.damaged or str(exc))


def whole(item: Item, pieces: list[str]) -> MorgueRecord:
    """A record from its record item and the rest of its body's pieces."""
    try:
        body_fields = ("first_sent_at", "body", "body_bytes", "body_sha256")
        v = checked(item.value, (*_SUMMARY, *STRINGS[4:], *body_fields))
        body = "".join([v["body"], *pieces])
        raw = body.encode("utf-8", "surrogatepass")
        if len(raw) != v["body_bytes"] or hashlib.sha256(raw).hexdigest() != v["body_sha256"]:
            raise ValueError("the body does not match its recorded size and SHA-256")
    except ValueError as exc:
        return _unreadable_item(item.key, item.value, str(exc))
    return replace(
        summary(item),
        **{k: v[k] for k in ("error_message", "traceback", "body_bytes", "body_sha256")},
        first_sent_at=float(v["first_sent_at"]),
        source_queue=str(v.get("source_queue", "")),
        meta=dict(v["meta"]) if isinstance(v.get("meta"), dict) else {},
        body=body,
    )


def pieces_of(value: Mapping[str, Any]) -> int:
    """How many items the record's body takes (1 if it does not say)."""
    n = value.get("pieces")
    return n if type(n) is int and 1 <= n <= 1000 else 1


def unreadable(why: str, entity: str, message_id: str, **known: Any) -> MorgueRecord:
    """What a record shardq cannot read is listed as: ``why``, and what is ``known`` of it."""
    error = f"not a readable shardq morgue record: {why}"
    return MorgueRecord(entity, message_id, REASON_UNREADABLE, error_message=error, **known)


def _unreadable_item(key: str, value: Mapping[str, Any], why: str) -> MorgueRecord:
    entity = value.get("entity_id")
    entity = entity if isinstance(entity, str) else unquote(_parse(key)[1])
    body = json.dumps(value, default=str)[:4000]
    message_id = str(value.get("message_id", key))
    return unreadable(why, entity, message_id, body=body, pieces=pieces_of(value), key=key)


def requeue_problem(record: MorgueRecord) -> str | None:
    """Why this dead job cannot be requeued, or None."""
    if record.reason == REASON_UNREADABLE:
        return record.error_message
    if not record.body:
        return "its body was too large for the old morgue queue: only why it died was kept"
    return None


def checked(value: Mapping[str, Any], fields: tuple[str, ...]) -> Mapping[str, Any]:
    """``value``, once its ``fields`` have their types; else ValueError."""
    for key in fields:
        valid, kind = _KINDS.get(key, (lambda v: isinstance(v, str), "a string"))
        if not valid(value.get(key)):
            raise ValueError(f"field {key} is not {kind}")
    return value


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "attempts": (lambda v: type(v) is int and v >= 0, "a whole number"),
    "body_bytes": (lambda v: type(v) is int, "a whole number"),
    "failed_at": (_is_time, "a time"),
    "first_sent_at": (_is_time, "a time"),
    "pieces": (lambda v: v is None or pieces_of({"pieces": v}) == v, "a count from 1 to 1000"),
}


def _split(body: str) -> list[str]:
    """``body`` in pieces whose JSON is at most :data:`PIECE_BYTES` bytes each."""
    pieces: list[str] = []
    start = 0
    while start < len(body) or not pieces:
        n = PIECE_BYTES
        while len(json.dumps(body[start : start + n])) > PIECE_BYTES:
            n //= 2
        pieces.append(body[start : start + n])
        start += n
    return pieces


def bury(
    store: Store, worker: str, records: Iterable[MorgueRecord], *, at_death: bool = False
) -> None:
    """Write the records of dead jobs in order, each job once (StoreError if refused);
    ``at_death``: each at its own death time (moved from the old queue morgue). A job's
    id item is written first and names its summary, written last: a burial cut short
    (its node killed midway) is finished by the next one, under the same keys."""
    for record in records:
        key = id_key(worker, record.message_id)
        try:
            named = store.get(key)
            summary_key = None if named is None else named.value.get("summary")
        except DamagedItem:
            summaries = _summaries(store, worker, record)
            if any(written(store, k) for k in summaries):
                continue
            named = _there(store, key)  # rewritten, naming a record cut short if any
            summary_key = next(iter(summaries), None)
        stamp = stamp_of(summary_key, worker, record.entity_id)
        if named is not None and not named.damaged and stamp and written(store, str(summary_key)):
            continue  # buried already
        *rest, (_, ids), (t, top) = items(
            worker, record, stamp or new_stamp(record.failed_at if at_death else None)
        )
        if named is None or named.damaged or stamp is None:  # naming no summary of the job
            _over(store, key, ids, named)
        for piece, value in rest:
            _put_over(store, piece, value)
        with suppress(StoreConflict):  # written meanwhile: another node buried it too
            store.put(t, top, version=None)


def _summaries(store: Store, worker: str, record: MorgueRecord) -> list[str]:
    """With its id item damaged: the summary keys of the job's records (its entity's
    records holding its message id). DamagedItem if one that might be is damaged whole
    (whether it is this job is not known: burying it might record it twice)."""
    entity = f"morgue/{worker}/e/{entity_key(record.entity_id)}/"
    return [
        keys_of(item.key, 1)[0]
        for item in store.query_all(entity, keep_damaged=True)
        if _message_id(store, item) == record.message_id
    ]


def _put_over(store: Store, key: str, value: dict[str, Any]) -> None:
    """Write an item of a burial over what one cut short wrote there, at its version
    (StoreConflict if another node's burial of the job wrote it meanwhile)."""
    try:
        store.put(key, value, version=None)
    except StoreConflict:
        _over(store, key, value, _there(store, key))


def _there(store: Store, key: str) -> Item | None:
    """The item at ``key`` as read, damaged or not."""
    return next((i for i in store.query(key, limit=1, keep_damaged=True) if i.key == key), None)


def _over(store: Store, key: str, value: dict[str, Any], there: Item | None) -> None:
    """Write ``value`` over ``there`` (as read) at its version; an item whose version
    cannot be read (0: no write can name it) is deleted first."""
    if there is not None and not there.version:
        store.delete(key)
        there = None
    store.put(key, value, version=None if there is None else there.version)


def _message_id(store: Store, item: Item) -> Any:
    """The message id of a record item, read from its summary if the item is damaged."""
    if not item.damaged:
        return item.value.get("message_id")
    written = store.get(keys_of(item.key, 1)[0])  # DamagedItem if damaged too
    return None if written is None else written.value.get("message_id")


def written(store: Store, key: str) -> bool:
    try:
        return store.get(key) is not None
    except DamagedItem:  # written, then damaged
        return True
