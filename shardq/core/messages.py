"""What brokers send, receive and report: plain values every layer may hold."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from shardq.core.limits import MAX_BATCH_ENTRIES


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
    """Approximate numbers of messages waiting (visible) and in flight (invisible).

    Brokers that can tell also give the send time of the oldest message (for lag)
    and how many messages were ever deleted (for throughput); SQS gives neither.
    """

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


T = TypeVar("T")


def batches(items: Sequence[T]) -> Iterator[list[T]]:
    """Consecutive slices of at most 10 items: one batch call each."""
    for start in range(0, len(items), MAX_BATCH_ENTRIES):
        yield list(items[start : start + MAX_BATCH_ENTRIES])
