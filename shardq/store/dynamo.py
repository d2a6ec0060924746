"""The state store as one on-demand DynamoDB table: partition key ``ns`` (the namespace),
sort key ``key`` (the whole key), ``value`` (JSON) and ``version``; consistent reads."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import botocore.exceptions

from shardq.broker.sqs_client import (
    TIMEOUTS,
    Unanswered,
    bad_region,
    make_client,
    no_credentials,
    timed_out,
    unloadable,
    worst_call_seconds,
)
from shardq.core.config import CONNECT_TIMEOUT, READ_TIMEOUT, check_timeouts
from shardq.store import base
from shardq.store.base import Item, Store, StoreConflict, StoreError

_KEYS = {"ns": "HASH", "key": "RANGE"}
#: The state table of an app is named ``{queue_prefix}shardq-state``.
TABLE_SUFFIX = "shardq-state"


class DynamoStore(Store):
    """Items in the DynamoDB table ``table``; credentials from boto3's default chain;
    each attempt of a call gets ``connect_timeout`` and ``read_timeout`` seconds."""

    kind = "dynamodb"

    def __init__(
        self,
        table: str,
        *,
        region: str | None,
        endpoint_url: str | None,
        unanswered: Unanswered | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        check_timeouts("DynamoStore", connect_timeout, read_timeout)
        self.table = table
        self.unanswered = unanswered or Unanswered(
            bound=worst_call_seconds(connect_timeout, read_timeout)
        )
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        try:  # the SQS calls' timeouts and retries
            self.client = make_client(
                "dynamodb", region, endpoint_url, connect=connect_timeout, read=read_timeout
            )
        except botocore.exceptions.NoRegionError as exc:
            where = "`region`, store_url's ?region=, SHARDQ_REGION or AWS_DEFAULT_REGION"
            raise StoreError(f"no AWS region for DynamoDB: set {where}") from exc
        except botocore.exceptions.InvalidRegionError as exc:
            where = "`region`, store_url's ?region=, SHARDQ_REGION and AWS_DEFAULT_REGION"
            raise StoreError(bad_region("DynamoDB", exc, where)) from exc
        except botocore.exceptions.BotoCoreError as exc:  # half a key, an unknown profile
            raise StoreError(unloadable("DynamoDB", exc)) from exc

    @contextmanager
    def _call(self, call: str, key: str = "", expected: int | None = None) -> Iterator[None]:
        endpoint = self.client.meta.endpoint_url
        earlier = self.unanswered.earlier(endpoint)
        if earlier is not None:
            raise StoreError(f"DynamoDB {call}: not sent: {earlier}")
        try:
            yield
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            response: Any = getattr(exc, "response", None) or {}  # ClientError's answer
            code = response.get("Error", {}).get("Code", "")
            if code == "ConditionalCheckFailedException":
                old = response.get("Item")
                # shown only; a hand edit may have dropped or retyped it
                current = old.get("version", {}).get("N", "unreadable") if old else None
                raise StoreConflict(base.conflict(key, expected, current)) from None
            if isinstance(exc, botocore.exceptions.NoCredentialsError):
                raise StoreError(no_credentials(f"DynamoDB {call}")) from None
            if isinstance(exc, TIMEOUTS):
                error = timed_out(
                    f"DynamoDB {call}",
                    exc,
                    service="the state table",
                    connect=self.connect_timeout,
                    read=self.read_timeout,
                )
                self.unanswered.record(endpoint, error)
                raise StoreError(error) from None
            if code == "ResourceNotFoundException":
                raise StoreError(
                    f"DynamoDB {call}: the state table {self.table!r} does not exist (or is "
                    "not in this region/account): run `shardq queues ensure`"
                ) from None
            raise StoreError(
                f"DynamoDB {call} on {self.table!r} failed ({exc}); check the network, the "
                "endpoint, the credentials and the IAM permissions (docs/deployment.md), then retry"
            ) from None

    def get(self, key: str) -> Item | None:
        with self._call("GetItem"):
            got = self.client.get_item(TableName=self.table, Key=_key(key), ConsistentRead=True)
        return None if "Item" not in got else _item(got["Item"])

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        text = base.encode(value)
        new = 1 if version is None else version + 1
        record = {**_key(key), "value": {"S": text}, "version": {"N": str(new)}}
        with self._call("PutItem", key, version):
            try:
                self.client.put_item(
                    TableName=self.table, Item=record, **_condition(version, exists=False)
                )
            except botocore.exceptions.ClientError as exc:
                if not _own_write(exc, record):
                    raise
        return Item(key, json.loads(text), new)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        with self._call("DeleteItem", key, version):
            old = self.client.delete_item(
                TableName=self.table,
                Key=_key(key),
                ReturnValues="ALL_OLD",
                **_condition(version, exists=True),
            ).get("Attributes")
        return old is not None

    def query(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int = base.MAX_QUERY_ITEMS,
        keep_damaged: bool = False,
    ) -> list[Item]:
        limit = max(0, min(limit, base.MAX_QUERY_ITEMS))
        return self._query(prefix, start_after, limit, keep_damaged)

    def query_all(self, prefix: str, *, keep_damaged: bool = False) -> list[Item]:
        """Every page DynamoDB returns (1 MB each), and no query more after a full one."""
        return self._query(prefix, None, None, keep_damaged)

    def _query(
        self, prefix: str, start_after: str | None, limit: int | None, keep_damaged: bool
    ) -> list[Item]:
        space = base.namespace(prefix)[0]
        args: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "ns = :ns AND begins_with(#k, :prefix)",
            "ExpressionAttributeNames": {"#k": "key"},
            "ExpressionAttributeValues": {":ns": {"S": space}, ":prefix": {"S": prefix}},
            "ConsistentRead": True,
        }
        if start_after is not None and start_after >= prefix:
            if not start_after.startswith(prefix):
                return []  # past every key under the prefix
            args["ExclusiveStartKey"] = _key(start_after)
        items: list[Item] = []
        while limit is None or len(items) < limit:
            with self._call("Query"):
                page = self.client.query(
                    **args, **({} if limit is None else {"Limit": limit - len(items)})
                )
            items += [_item(found, keep_damaged) for found in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return items[:limit]

    def ensure_table(self) -> bool:
        created = False
        with self._call("CreateTable"):
            try:
                self.client.describe_table(TableName=self.table)
            except self.client.exceptions.ResourceNotFoundException:
                self.client.create_table(
                    TableName=self.table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[
                        {"AttributeName": n, "AttributeType": "S"} for n in _KEYS
                    ],
                    KeySchema=[{"AttributeName": n, "KeyType": t} for n, t in _KEYS.items()],
                )
                created = True
            self.client.get_waiter("table_exists").wait(
                TableName=self.table,
                WaiterConfig={"Delay": 1, "MaxAttempts": 120},  # up to 2 minutes
            )
        return created

    def close(self) -> None:
        self.client.close()


def _key(key: str) -> dict[str, Any]:
    return {"ns": {"S": base.namespace(key)[0]}, "key": {"S": key}}


def _own_write(exc: botocore.exceptions.ClientError, record: Mapping[str, Any]) -> bool:
    """Whether a put failed only because its own earlier, unanswered attempt wrote ``record``."""
    retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0
    found: Any = exc.response.get("Item")
    return retried and found is not None and all(found.get(k) == v for k, v in record.items())


def _item(found: Mapping[str, Any], keep_damaged: bool = False) -> Item:
    """An item as DynamoDB returned it; a hand edit may have dropped or retyped a field."""
    text, version = found.get("value", {}).get("S"), found.get("version", {}).get("N")
    return base.item(found["key"]["S"], text, version, keep_damaged=keep_damaged)


def _condition(version: int | None, *, exists: bool) -> dict[str, Any]:
    if version is None and exists:
        return {}
    condition: dict[str, Any] = {
        "ConditionExpression": "attribute_not_exists(#v)",  # every item has a version
        "ExpressionAttributeNames": {"#v": "version"},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    if version is not None:
        condition["ConditionExpression"] = "#v = :v"
        condition["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
    return condition
