"""Brokers: the embedded SQLite broker (default), an in-memory one, and SQS FIFO."""

from __future__ import annotations

from urllib.parse import urlsplit

from shardq.broker.base import BatchResult as BatchResult
from shardq.broker.base import Broker as Broker
from shardq.broker.base import Message as Message
from shardq.broker.base import QueueCounts as QueueCounts
from shardq.broker.base import QueueSettings as QueueSettings
from shardq.broker.base import SendEntry as SendEntry
from shardq.broker.base import SendResult as SendResult
from shardq.broker.sqlite import MemoryBroker as MemoryBroker
from shardq.broker.sqlite import SqliteBroker as SqliteBroker
from shardq.core.config import CONNECT_TIMEOUT, READ_TIMEOUT, url_parameters
from shardq.core.errors import ConfigError

URL_FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db, memory:// or sqs://"
#: The query parameters each URL scheme accepts (``test_*``: shardq's own tests only,
#: emulating other emulators' behaviour; see docs/design/broker.md).
URL_PARAMETERS = {
    "sqlite": ("allow_other_tables", "test_reopen_groups", "test_stale_visibility"),
    "memory": ("test_reopen_groups", "test_stale_visibility"),
    "sqs": ("region", "endpoint_url"),
}


def broker_from_url(
    url: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
) -> Broker:
    """Make a broker from a URL; unknown query parameters are refused (the timeouts:
    SQS's, in seconds)."""
    parts = urlsplit(url)
    if parts.scheme not in URL_PARAMETERS:
        raise ConfigError(f"broker_url {url!r} is not supported; use {URL_FORMS}")
    if parts.netloc or parts.fragment:  # no scheme reads them: refused, not dropped
        part = parts.netloc or f"#{parts.fragment}"
        if parts.password:
            part = part.replace(f":{parts.password}@", ":***@")
        raise ConfigError(
            f"broker_url: {part!r} is not read by {parts.scheme}:// URLs (no host, credentials "
            f"or #fragment); use {URL_FORMS}"
        )
    query = url_parameters("broker_url", url, URL_PARAMETERS[parts.scheme])
    if parts.scheme == "sqs":
        from shardq.broker.sqs import SqsBroker  # boto3 is imported only when used

        region, endpoint_url = query.get("region", region), query.get("endpoint_url", endpoint_url)
        return SqsBroker(
            region=region,
            endpoint_url=endpoint_url,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
    flags = {}
    for name in URL_PARAMETERS[parts.scheme]:
        value = query.get(name, "0").lower()
        if value not in ("1", "true", "yes", "0", "false", "no"):
            raise ConfigError(f"broker_url {url!r}: {name} must be 1 or 0, got {value!r}")
        flags[name.removeprefix("test_")] = value in ("1", "true", "yes")
    if parts.scheme == "memory":
        return MemoryBroker(**flags)
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"broker_url {url!r} has no file path; use {URL_FORMS}")
    return SqliteBroker(path, **flags)
