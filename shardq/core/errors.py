"""The exceptions shardq raises, all derived from :class:`ShardqError`; each message says
what went wrong and what to do about it."""

from __future__ import annotations

import datetime as dt
from typing import Any


class ShardqError(Exception):
    """Base class of every exception shardq raises on purpose."""


class ConfigError(ShardqError):
    """A configuration value is invalid; the message names the key and its source."""


class WorkerDefinitionError(ShardqError, TypeError):
    """A worker class declares an invalid attribute; fix the class attribute named."""


class UnknownWorkerError(ShardqError, LookupError):
    """A worker name is not registered with the app in use."""


class InvalidEntityIdError(ShardqError, ValueError):
    """An entity id cannot be carried as an SQS FIFO MessageGroupId."""


class PayloadError(ShardqError, ValueError):
    """A payload cannot be published (not JSON-serialisable, or too large)."""


class PayloadTooLargeError(PayloadError):
    """An encoded job exceeds the queue's maximum message size."""


class DedupIdError(ShardqError, ValueError):
    """A ``dedup_id`` is not a non-empty string of valid Unicode."""


class MetricsServerError(ShardqError):
    """The Prometheus endpoint cannot listen where asked (port in use, bad address)."""


class EnvelopeError(ShardqError, ValueError):
    """A message body is not a valid shardq envelope (malformed, unsigned, future version)."""


class BrokerError(ShardqError):
    """A broker call failed; the message names the call. Retry, or check the broker."""


class QueueNotFoundError(BrokerError):
    """A queue does not exist; run ``shardq queues ensure`` or let the node create it."""


class LayoutError(ShardqError):
    """A reshard was refused, a layout item is damaged or too old to trust, or a class's
    ``shards`` disagrees with its recorded layout."""


class PublishError(ShardqError):
    """Some jobs of a publish were not accepted by the broker: ``failed`` lists
    ``(index, entity_id, reason)`` of each (every other job was published; an index past
    the caller's items is a job an ``around_publish`` middleware made itself). Publish them
    again with the same ``dedup_id`` to stay idempotent."""

    def __init__(
        self,
        message: str,
        failed: list[tuple[int, str, str]],
        sent: int,
        gaps: list[tuple[int, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.failed = failed
        self.sent = sent
        #: ``(index, entity_id)`` of jobs SQS accepted after refusing an earlier job of
        #: their entity in the same batch: they are published, out of order.
        self.gaps = gaps or []


class Retry(Exception):
    """Raise from ``perform`` to retry the job, keeping its order: ``Retry(delay=30)`` in
    30 s, ``Retry(at=datetime)`` then, ``Retry()`` at once; it counts toward ``max_retries``.
    """

    def __init__(self, delay: float | None = None, at: Any = None) -> None:
        if delay is not None and at is not None:
            raise ValueError("Retry takes delay= or at=, not both")
        for name, when in (("delay", delay), ("at", at)):
            if when is None or isinstance(when, dt.datetime):
                continue
            try:  # as the retry decision reads it
                float(when)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(
                    f"Retry({name}={when!r}) takes seconds (a number)"
                    + (" or a datetime" if name == "at" else "")
                ) from None
        super().__init__(f"retry requested (delay={delay!r}, at={at!r})")
        self.delay = delay
        self.at = at


class PermanentError(Exception):
    """Raise from ``perform`` (or subclass) to send a job straight to the morgue."""
