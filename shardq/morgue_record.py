"""The morgue record: the message that holds a dead job, and why it died.

A record is one line of JSON (the header: why the job died, its entity, its message
id, the size and SHA-256 of its body), a newline, then the job's original body
verbatim. The body is never escaped again, so a record is only a header longer than
the job it holds. When the header and body would not fit the morgue queue's size
limit, the traceback is trimmed first (its end is kept), then the error message
(its start is kept); if even a bare header leaves no room for the body, the record
keeps the header alone with ``body_kept: false`` plus the body's size and hash, and
an error is logged: the job is in the morgue, its body is not, and it cannot be
requeued. A record therefore always fits, and a job never loops for want of one.

Records written before this format (version 1: one JSON object with the body as a
string field) are still read.
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from dataclasses import dataclass
from typing import Any

import structlog

from shardq.broker.base import Message, SendEntry
from shardq.envelope import refuse_constant
from shardq.errors import BrokerError

log = structlog.get_logger("shardq.morgue")

KIND = "shardq.morgue"
VERSION = 2
MAX_TRACEBACK_CHARS = 8000
MAX_ERROR_MESSAGE_CHARS = 2000
MAX_ERROR_TYPE_CHARS = 200
TRIMMED = "[trimmed to fit the morgue's size limit]"

#: Why a job is in the morgue.
REASON_MAX_RETRIES = "max_retries"
REASON_PERMANENT = "permanent_error"
REASON_INVALID = "invalid_message"
REASON_UNKNOWN_WORKER = "unknown_worker"
#: Not a reason shardq writes: a morgue message shardq cannot read (written by
#: something else, or damaged). It is listed as such and never requeued.
REASON_UNREADABLE = "unreadable_record"


@dataclass(frozen=True)
class MorgueRecord:
    """A dead job: its original body and why it died."""

    body: str
    entity_id: str
    reason: str
    error_type: str
    error_message: str
    traceback: str
    attempts: int
    failed_at: float
    source_queue: str
    message_id: str
    #: Size (UTF-8 bytes) and SHA-256 of the job's original body.
    body_bytes: int | None = None
    body_sha256: str | None = None
    #: False when the body did not fit in the morgue: ``body`` is then empty.
    body_kept: bool = True


_STRINGS = ("entity_id", "reason", "error_type", "error_message", "traceback")
_HEADER_STRINGS = (*_STRINGS, "source_queue", "message_id")


def record_for(message: Message, reason: str, error: BaseException, attempts: int) -> MorgueRecord:
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    body = message.body.encode("utf-8", "surrogatepass")
    return MorgueRecord(
        body=message.body,
        entity_id=message.group_id,
        reason=reason,
        error_type=type(error).__name__[:MAX_ERROR_TYPE_CHARS],
        error_message=str(error)[:MAX_ERROR_MESSAGE_CHARS],
        traceback=tb[-MAX_TRACEBACK_CHARS:],
        attempts=attempts,
        failed_at=time.time(),
        source_queue=message.queue,
        message_id=message.message_id,
        body_bytes=len(body),
        body_sha256=hashlib.sha256(body).hexdigest(),
    )


def encode(record: MorgueRecord, max_bytes: int) -> str:
    """The morgue message body, at most ``max_bytes`` UTF-8 bytes (see the module doc)."""
    body = record.body.encode("utf-8", "surrogatepass")
    head = {
        "kind": KIND,
        "v": VERSION,
        **{k: getattr(record, k) for k in _HEADER_STRINGS},
        "attempts": record.attempts,
        "failed_at": record.failed_at,
        "body_bytes": len(body) if record.body_kept else record.body_bytes,
        "body_sha256": hashlib.sha256(body).hexdigest() if record.body_kept else record.body_sha256,
        "body_kept": record.body_kept,
    }
    whole = dict(head)
    if record.body_kept and _fit(whole, max_bytes - len(body) - 1):  # 1: the newline
        return _dump(whole) + "\n" + record.body
    bare = {**head, "body_kept": False}
    if not _fit(bare, max_bytes - 1):
        raise BrokerError(
            f"the morgue queue accepts {max_bytes} bytes, too few for even the header of "
            f"job {record.message_id}'s record; raise the queue's MaximumMessageSize"
        )
    if record.body_kept:
        log.error(
            "morgue.body_dropped",
            entity=record.entity_id,
            message_id=record.message_id,
            body_bytes=head["body_bytes"],
            body_sha256=head["body_sha256"],
            max_bytes=max_bytes,
            detail="the job is in the morgue without its body: the body alone fills the "
            "morgue's size limit; it cannot be requeued",
        )
    return _dump(bare) + "\n"


def entry(record: MorgueRecord, max_bytes: int) -> SendEntry:
    """The send entry of a record; its body is never larger than ``max_bytes``."""
    return SendEntry("0", encode(record, max_bytes), record.entity_id, record.message_id)


def decode(text: str) -> MorgueRecord:
    """Read a record (this format or version 1); ValueError says why it is not one."""
    header, newline, body = text.partition("\n")
    try:
        doc = json.loads(header if newline else text, parse_constant=refuse_constant)
    except RecursionError:
        raise ValueError("nested too deeply to be a morgue record") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError("not a shardq morgue record")
    version = doc.get("v")
    extra: dict[str, Any] = {}
    if version == 1 and not newline:
        old_body = doc.get("body")
        if not isinstance(old_body, str):
            raise ValueError("field body is not a string")
        body = old_body
    elif version == VERSION and newline:
        extra = _body_fields(doc, body)
    else:
        raise ValueError(f"morgue record version {version!r} is not supported")
    for key in _HEADER_STRINGS:
        if not isinstance(doc.get(key), str):
            raise ValueError(f"field {key} is not a string")
    attempts, failed_at = doc.get("attempts"), doc.get("failed_at")
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
        raise ValueError("field attempts is not a whole number")
    if (
        not isinstance(failed_at, (int, float))
        or isinstance(failed_at, bool)
        or not 0 <= failed_at < 1e11
    ):
        raise ValueError("field failed_at is not a time")
    return MorgueRecord(
        body=body,
        **{k: doc[k] for k in _HEADER_STRINGS},
        attempts=attempts,
        failed_at=float(failed_at),
        **extra,
    )


def unreadable(message: Message, why: str) -> MorgueRecord:
    """What a morgue message shardq cannot read is listed as."""
    return MorgueRecord(
        body=message.body,
        entity_id=message.group_id,
        reason=REASON_UNREADABLE,
        error_type="",
        error_message=f"not a readable shardq morgue record: {why}",
        traceback="",
        attempts=0,
        failed_at=message.sent_at,
        source_queue="",
        message_id=message.message_id,
    )


def requeue_problem(record: MorgueRecord) -> str | None:
    """Why this dead job cannot be requeued, or None."""
    if record.reason == REASON_UNREADABLE:
        return record.error_message
    if not record.body_kept:
        return (
            f"its body ({record.body_bytes} bytes, sha256 {record.body_sha256}) was too "
            "large to keep in the morgue; only why it died was recorded"
        )
    return None


# -- internals ------------------------------------------------------------------------
def _body_fields(doc: dict[str, Any], body: str) -> dict[str, Any]:
    size, digest, kept = doc.get("body_bytes"), doc.get("body_sha256"), doc.get("body_kept")
    if type(size) is not int or not isinstance(digest, str) or type(kept) is not bool:
        raise ValueError("fields body_bytes, body_sha256 or body_kept are missing or malformed")
    if kept:
        raw = body.encode("utf-8", "surrogatepass")
        if len(raw) != size or hashlib.sha256(raw).hexdigest() != digest:
            raise ValueError("the body does not match its recorded size and SHA-256")
    elif body:
        raise ValueError("a record without its body carries one")
    return {"body_bytes": size, "body_sha256": digest, "body_kept": kept}


def _dump(doc: dict[str, Any]) -> str:
    # ASCII only: one byte per character, and no lone surrogate can fail the send
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _fit(head: dict[str, Any], budget: int) -> bool:
    """Trim ``head``'s traceback (keeping its end), then its error message (keeping its
    start), until the header fits ``budget`` bytes."""
    for key, keep_end in (("traceback", True), ("error_message", False)):
        original: str = head[key]
        cut = 0
        while head[key] and (excess := len(_dump(head)) - budget) > 0:
            cut += excess  # each character dumps to at least one byte
            keep = len(original) - cut - len(TRIMMED) - 1
            if keep <= 0:
                head[key] = ""
            elif keep_end:
                head[key] = f"{TRIMMED} {original[-keep:]}"
            else:
                head[key] = f"{original[:keep]} {TRIMMED}"
    return len(_dump(head)) <= budget


__all__ = [
    "KIND",
    "REASON_INVALID",
    "REASON_MAX_RETRIES",
    "REASON_PERMANENT",
    "REASON_UNKNOWN_WORKER",
    "REASON_UNREADABLE",
    "VERSION",
    "MorgueRecord",
    "decode",
    "encode",
    "entry",
    "record_for",
    "requeue_problem",
    "unreadable",
]
