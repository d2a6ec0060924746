"""Brokers: the embedded SQLite broker (default), an in-memory one, and SQS FIFO."""

from __future__ import annotations

from urllib.parse import urlsplit

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
from shardq.core.config import url_parameters
from shardq.core.errors import ConfigError

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

#: The query parameters each URL scheme accepts.
URL_PARAMETERS = {
    # allow_other_tables: share the file with other applications' tables on purpose.
    # test_reopen_groups: test-only emulation of a LocalStack FIFO defect (see
    # shardq.broker.sqlite); test_stale_visibility: test-only emulation of another
    # emulator's visibility behaviour (same module); never in production.
    "sqlite": ("allow_other_tables", "test_reopen_groups", "test_stale_visibility"),
    "memory": ("test_reopen_groups", "test_stale_visibility"),
    "sqs": ("region", "endpoint_url"),
}
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


def broker_from_url(
    url: str, *, region: str | None = None, endpoint_url: str | None = None
) -> Broker:
    """Make a broker from a URL; unknown query parameters are refused."""
    parts = urlsplit(url)
    if parts.scheme not in URL_PARAMETERS:
        raise ConfigError(f"broker_url {url!r} is not supported; use {URL_FORMS}")
    query = url_parameters("broker_url", url, URL_PARAMETERS[parts.scheme])
    if parts.scheme == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigError(f"broker_url {url!r} has no file path; use {URL_FORMS}")
        return SqliteBroker(
            path,
            reopen_groups=_flag(url, query, "test_reopen_groups"),
            stale_visibility=_flag(url, query, "test_stale_visibility"),
            allow_other_tables=_flag(url, query, "allow_other_tables"),
        )
    if parts.scheme == "memory":
        return MemoryBroker(
            reopen_groups=_flag(url, query, "test_reopen_groups"),
            stale_visibility=_flag(url, query, "test_stale_visibility"),
        )
    from shardq.broker.sqs import SqsBroker  # boto3 is imported only when used

    return SqsBroker(
        region=query.get("region", region),
        endpoint_url=query.get("endpoint_url", endpoint_url),
    )


def _flag(url: str, query: dict[str, str], name: str) -> bool:
    value = query.get(name, "0").lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"broker_url {url!r}: {name} must be 1 or 0, got {value!r}")
    return value in _TRUE
