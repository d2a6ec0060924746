"""What brokers send, receive and report: plain values every layer may hold."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from shardq.core.limits import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES


@dataclass(frozen=True)
class SendEntry:
    """One message to send: ``id`` is unique within the batch."""

    id: str
    body: str
    group_id: str
    dedup_id: str


@dataclass(frozen=True)
class Message:
    """A received message. ``receipt`` is needed to delete or change visibility."""

    queue: str
    message_id: str
    receipt: str
    body: str
    group_id: str
    receive_count: int
    sent_at: float
    sequence: str
    #: When this receive happened (visibility can be extended to 12 h after it).
    received_at: float = 0.0


@dataclass
class SendResult:
    """``message_ids`` maps each accepted entry id to its message id; ``failed`` to a reason."""

    message_ids: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class BatchResult:
    """Outcome of a delete or visibility batch: ``failed`` maps a receipt to a reason."""

    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueCounts:
    """Approximate numbers of messages waiting (visible) and in flight (invisible), and,
    from brokers that can tell (not SQS), the oldest one's send time and deletes ever."""

    waiting: int
    in_flight: int
    oldest_sent_at: float | None = None
    deleted_total: int | None = None


@dataclass(frozen=True)
class QueueSettings:
    """What a queue is configured with, for drift checks."""

    fifo: bool
    visibility_timeout: int
    max_message_bytes: int
    content_based_dedup: bool
    #: MessageRetentionPeriod (None: the broker keeps messages until deleted).
    retention_seconds: int | None = None
    #: RedrivePolicy as SQS gives it (JSON), "" if none.
    redrive_policy: str = ""


T = TypeVar("T")


def batches(items: Iterable[T], size_of: Callable[[T], int] | None = None) -> Iterator[list[T]]:
    """Consecutive runs of at most 10 items (and, given ``size_of``, at most 1 MiB): one
    batch call each."""
    chunk: list[T] = []
    size = 0
    for item in items:
        bytes_ = size_of(item) if size_of is not None else 0
        if chunk and (len(chunk) == MAX_BATCH_ENTRIES or size + bytes_ > MAX_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += bytes_
    if chunk:
        yield chunk
