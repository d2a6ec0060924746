"""The broker interface: the few queue operations shardq needs from SQS FIFO.

Every implementation gives SQS FIFO's semantics (a group's messages in send order, none
while one is in flight; 5-minute deduplication; per-entry batch failures), checked by
``tests/test_broker_contract.py``.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Sequence

import structlog

from shardq.core.errors import BrokerError
from shardq.core.limits import (
    BODY_REFUSED,
    GROUP_ID_PATTERN,
    MAX_BATCH_BYTES,
    MAX_BATCH_ENTRIES,
    MAX_VISIBILITY_SECONDS,
    MIN_MESSAGE_BYTES,
)
from shardq.core.messages import BatchResult as BatchResult
from shardq.core.messages import Message as Message
from shardq.core.messages import QueueCounts as QueueCounts
from shardq.core.messages import QueueSettings as QueueSettings
from shardq.core.messages import SendEntry as SendEntry
from shardq.core.messages import SendResult as SendResult
from shardq.core.messages import batches as batches

log = structlog.get_logger("shardq.broker")


class Broker(abc.ABC):
    """A FIFO queue service. Implementations must be safe to call from many threads."""

    #: Short name used in logs and URLs (``sqlite``, ``memory``, ``sqs``).
    kind: str = "broker"
    #: Seconds a node may hold back a delete or visibility change to fill a batch of
    #: 10 (each request costs a round trip, and money on SQS).
    settle_linger: float = 0.002
    #: Seconds a node's read-ahead receive may wait for a message (whole seconds on
    #: SQS): an empty answer costs a request, a short wait usually does not.
    prefetch_wait: float = 0.0

    @abc.abstractmethod
    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        """Create the FIFO queue ``name`` (ending in ``.fifo``) unless it exists."""

    @abc.abstractmethod
    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        """Send up to 10 messages (at most 1 MiB together), in order."""

    @abc.abstractmethod
    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        """Receive up to ``max_messages``, waiting up to ``wait_seconds`` for the first."""

    @abc.abstractmethod
    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        """Delete received messages. A stale or expired receipt fails for its entry."""

    @abc.abstractmethod
    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        """Make each message visible again after the given seconds (0 = now)."""

    @abc.abstractmethod
    def counts(self, queue: str) -> QueueCounts:
        """Messages waiting and in flight in ``queue``."""

    @abc.abstractmethod
    def queue_settings(self, queue: str) -> QueueSettings | None:
        """The queue's settings, or None if it does not exist."""

    @abc.abstractmethod
    def max_message_bytes(self, queue: str) -> int:
        """The queue's largest accepted message body, in bytes."""

    def retention_seconds(self, queue: str) -> int | None:
        """How long the queue keeps a message before deleting it unasked (cached), or
        None if it keeps messages until they are deleted (the embedded broker)."""
        return None

    def delete_queue(self, queue: str) -> None:
        """Delete ``queue`` and every message in it (a no-op if it does not exist)."""
        raise BrokerError(f"this broker cannot delete queues (asked to delete {queue})")

    def wake_waiters(self) -> None:  # noqa: B027 - optional for implementations
        """Make waiting receives return now, at shutdown (SQS cannot: a no-op)."""

    def watch(self, queues: Sequence[str], timeout: float) -> list[str] | None:
        """Wait up to ``timeout`` s until any of ``queues`` has a message a receive could
        return; those queues, [] on timeout or wake, or None if this broker cannot watch
        (SQS: long-poll each)."""
        return None

    def maintain(self) -> None:  # noqa: B027 - optional for implementations
        """Periodic housekeeping; the node calls it about every 30 s."""

    def close(self) -> None:  # noqa: B027 - optional for implementations
        """Release connections; the broker is not used afterwards."""


def check_batch(ids: Sequence[str]) -> None:
    """Raise if a batch (its entries' ids) is empty, too long, or repeats an id (SQS fails
    such calls whole)."""
    if not 1 <= len(ids) <= MAX_BATCH_ENTRIES:
        raise BrokerError(f"a batch takes 1 to {MAX_BATCH_ENTRIES} entries, got {len(ids)}")
    if len(set(ids)) != len(ids):
        raise BrokerError("batch entry ids must be distinct")


def valid_entries(
    entries: Sequence[SendEntry], max_bytes: Callable[[], int], result: SendResult
) -> list[SendEntry]:
    """The entries of a send batch SQS would accept; the others fail in ``result``. Raise
    for a batch SQS would refuse whole (size, count, repeated ids). ``max_bytes``, the
    queue's limit, is asked only for a body over the least any queue takes."""
    check_batch([e.id for e in entries])
    sizes = [len(e.body.encode("utf-8", "surrogatepass")) for e in entries]
    if sum(sizes) > MAX_BATCH_BYTES:
        raise BrokerError(f"batch of {sum(sizes)} bytes exceeds {MAX_BATCH_BYTES} bytes")
    limit = max_bytes() if max(sizes, default=0) > MIN_MESSAGE_BYTES else MIN_MESSAGE_BYTES
    valid = []
    for entry, size in zip(entries, sizes, strict=True):
        if size > limit:
            result.failed[entry.id] = f"message is {size} bytes; the queue accepts at most {limit}"
        elif not entry.body:
            result.failed[entry.id] = "SQS refuses an empty message body"
        elif not entry.body.isprintable() and (bad := BODY_REFUSED.search(entry.body)):
            result.failed[entry.id] = f"SQS refuses the character {bad.group()!r} in a body"
        elif not GROUP_ID_PATTERN.fullmatch(entry.group_id):
            result.failed[entry.id] = f"invalid MessageGroupId {entry.group_id!r}"
        elif not GROUP_ID_PATTERN.fullmatch(entry.dedup_id):
            result.failed[entry.id] = f"invalid MessageDeduplicationId {entry.dedup_id!r}"
        else:
            valid.append(entry)
    return valid


def check_receive(max_messages: int, visibility_timeout: float) -> None:
    """Raise for a receive SQS would refuse."""
    if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
        raise BrokerError(f"max_messages {max_messages} is outside 1..{MAX_BATCH_ENTRIES}")
    if not 0 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
        raise BrokerError(f"visibility_timeout {visibility_timeout} is outside 0..43200")


def release_now(broker: Broker, messages: Sequence[Message]) -> int:
    """Make held messages visible again at once, in order, for callers without a node;
    how many. Failures are logged: those reappear after their visibility timeout."""
    released = 0
    ordered = sorted(messages, key=lambda m: (m.queue, m.sequence))
    for queue, items in itertools.groupby(ordered, key=lambda m: m.queue):
        for chunk in batches(items):
            try:
                result = broker.change_visibility_batch(queue, [(m.receipt, 0) for m in chunk])
            except BrokerError as exc:
                log.warning(
                    "lease.release_failed",
                    queue=queue,
                    messages=len(chunk),
                    error=str(exc),
                    detail="they reappear after their visibility timeout",
                )
                continue
            released += len(chunk) - len(result.failed)
    return released
