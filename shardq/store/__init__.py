"""The state store (see :mod:`shardq.store.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from shardq.errors import ConfigError
from shardq.store.base import Item, Store, StoreConflict, StoreError
from shardq.store.sqlite import MemoryStore, SqliteStore

if TYPE_CHECKING:
    from shardq.broker.base import Broker
    from shardq.config import Config

__all__ = [
    "Item",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "store_for",
    "store_parameters",
]

#: The query parameters a ``dynamodb://`` store_url accepts.
STORE_URL_PARAMETERS = ("region", "endpoint_url", "table")


def store_parameters(url: str, where: str = "config") -> dict[str, str]:
    """The parameters of ``store_url`` (``dynamodb://?region=..&endpoint_url=..&table=..``);
    another scheme or an unknown parameter raises ConfigError."""
    parts = urlsplit(url)
    if parts.scheme != "dynamodb" or parts.netloc or parts.path:
        raise ConfigError(
            f"{where}: store_url: {url!r} is not supported; use "
            "dynamodb://?region=..&endpoint_url=..&table=.. (each optional), or leave "
            "store_url unset for the broker's own store"
        )
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - set(STORE_URL_PARAMETERS))
    if unknown:
        raise ConfigError(
            f"{where}: store_url {url!r} has unknown parameter(s) {', '.join(unknown)}; "
            f"dynamodb:// URLs take {', '.join(STORE_URL_PARAMETERS)}"
        )
    empty = sorted(k for k, v in query.items() if not v)
    if empty:
        raise ConfigError(f"{where}: store_url {url!r}: {', '.join(empty)} is empty")
    return query


def store_for(config: Config, broker: Broker) -> Store:
    """The store an app uses with ``broker``: DynamoDB if ``store_url`` says so or for
    ``sqs://`` (in the SQS region and endpoint unless ``store_url`` names others), the
    same SQLite file for the embedded broker, memory for ``memory://``."""
    from shardq.broker.sqlite import SqliteBroker

    if config.store_url is not None or broker.kind == "sqs":
        from shardq.store.dynamo import TABLE_SUFFIX, DynamoStore  # imports boto3

        query = store_parameters(config.store_url or "dynamodb://", config.source)
        region, endpoint, unanswered = config.region, config.endpoint_url, None
        if broker.kind == "sqs":  # where the broker's SQS is (it may be given in code)
            from shardq.broker.sqs import SqsBroker

            if isinstance(broker, SqsBroker):
                region, endpoint = broker.client.meta.region_name, broker.endpoint_url
                unanswered = broker.unanswered  # one memory of hung endpoints
        return DynamoStore(
            query.get("table", config.queue_prefix + TABLE_SUFFIX),
            region=query.get("region", region),
            endpoint_url=query.get("endpoint_url", endpoint),
            unanswered=unanswered,
        )
    if broker.kind == "sqlite" and isinstance(broker, SqliteBroker):
        return SqliteStore(broker.path)
    return MemoryStore()
