"""The morgue: one FIFO queue per worker for jobs that will not be retried.

A morgue message keeps the job's original body untouched and adds why it died.
Its group id is the job's entity, so requeued jobs keep their entity's order among
themselves; its deduplication id is the job's message id, so a node that crashes
between writing the morgue record and deleting the job does not record it twice
(within SQS's 5-minute dedup window).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass
from typing import Any

from shardq.broker.base import Message, SendEntry

KIND = "shardq.morgue"
VERSION = 1
MAX_TRACEBACK_CHARS = 8000

#: Why a job is in the morgue.
REASON_MAX_RETRIES = "max_retries"
REASON_PERMANENT = "permanent_error"
REASON_INVALID = "invalid_message"
REASON_UNKNOWN_WORKER = "unknown_worker"


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


def record_for(message: Message, reason: str, error: BaseException, attempts: int) -> MorgueRecord:
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return MorgueRecord(
        body=message.body,
        entity_id=message.group_id,
        reason=reason,
        error_type=type(error).__name__,
        error_message=str(error)[:2000],
        traceback=tb[-MAX_TRACEBACK_CHARS:],
        attempts=attempts,
        failed_at=time.time(),
        source_queue=message.queue,
        message_id=message.message_id,
    )


def encode(record: MorgueRecord, max_bytes: int) -> str:
    """The morgue message body, dropping the traceback if the whole would not fit."""
    doc: dict[str, Any] = {"kind": KIND, "v": VERSION, **record.__dict__}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode("utf-8")) > max_bytes:
        doc["traceback"] = "(dropped: the job's body leaves no room for it)"
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return text


def decode(text: str) -> MorgueRecord:
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError("not a shardq morgue record")
    fields = {k: doc[k] for k in MorgueRecord.__dataclass_fields__}
    return MorgueRecord(**fields)


def entry(record: MorgueRecord, max_bytes: int) -> SendEntry:
    return SendEntry("0", encode(record, max_bytes), record.entity_id, record.message_id)
