"""Brokers: the embedded SQLite broker (default), an in-memory one, and SQS FIFO."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from shardq.broker.base import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
)
from shardq.broker.sqlite import MemoryBroker, SqliteBroker
from shardq.errors import ConfigError

__all__ = [
    "BatchResult",
    "Broker",
    "MemoryBroker",
    "Message",
    "QueueCounts",
    "QueueSettings",
    "SendEntry",
    "SendResult",
    "SqliteBroker",
    "broker_from_url",
]

URL_FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db, memory:// or sqs://"


def broker_from_url(
    url: str, *, region: str | None = None, endpoint_url: str | None = None
) -> Broker:
    """Make a broker from a URL. ``sqs://?region=..&endpoint_url=..`` may carry both."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigError(f"broker_url {url!r} has no file path; use {URL_FORMS}")
        return SqliteBroker(path)
    if parts.scheme == "memory":
        return MemoryBroker()
    if parts.scheme == "sqs":
        from shardq.broker.sqs import SqsBroker  # boto3 is imported only when used

        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        return SqsBroker(
            region=query.get("region", region),
            endpoint_url=query.get("endpoint_url", endpoint_url),
        )
    raise ConfigError(f"broker_url {url!r} is not supported; use {URL_FORMS}")
