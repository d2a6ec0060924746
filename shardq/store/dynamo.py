"""The state store as one on-demand DynamoDB table (``{queue_prefix}shardq-state``).

Partition key ``ns`` (the key's namespace), sort key ``key`` (the whole key, so an
item keyed ``node/`` has a non-empty sort key), ``value`` (JSON text) and ``version``
(a number). Reads and queries are strongly consistent; every write is conditional.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from shardq.store import base
from shardq.store.base import Item, Store, StoreConflict, StoreError


def table_name(queue_prefix: str) -> str:
    """The state table of the app whose queues start with ``queue_prefix``."""
    return f"{queue_prefix}shardq-state"


class DynamoStore(Store):
    """Items in the DynamoDB table ``table``; credentials from boto3's default chain."""

    kind = "dynamodb"

    def __init__(self, table: str, *, region: str | None, endpoint_url: str | None) -> None:
        self.table = table
        config = botocore.config.Config(
            connect_timeout=5, read_timeout=10, retries={"mode": "adaptive", "max_attempts": 5}
        )
        try:
            self.client = boto3.session.Session().client(
                "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
            )
        except botocore.exceptions.NoRegionError as exc:
            raise StoreError(
                "no AWS region for DynamoDB: set `region` (or store_url's ?region=), "
                "SHARDQ_REGION or AWS_DEFAULT_REGION"
            ) from exc

    @contextmanager
    def _call(self, call: str, key: str = "", expected: int | None = None) -> Iterator[None]:
        try:
            yield
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ConditionalCheckFailedException":
                old: Any = exc.response.get("Item")
                current = int(old["version"]["N"]) if old else None
                raise StoreConflict(base.conflict(key, expected, current)) from None
            if code == "ResourceNotFoundException":
                raise StoreError(
                    f"DynamoDB {call}: the state table {self.table!r} does not exist (or is "
                    "not in this region/account): run `shardq queues ensure`"
                ) from None
            raise StoreError(
                f"DynamoDB {call} on {self.table!r} failed ({code}: {exc}); check the "
                "credentials, the IAM permissions (docs/deployment.md) and retry"
            ) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StoreError(
                f"DynamoDB {call} on {self.table!r} failed ({exc}); check the network, "
                "the endpoint and the credentials, then retry"
            ) from None

    def get(self, key: str) -> Item | None:
        with self._call("GetItem"):
            found = self.client.get_item(
                TableName=self.table, Key=_key(key), ConsistentRead=True
            ).get("Item")
        return None if found is None else _item(found)

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        text = base.encode(value)
        new = 1 if version is None else version + 1
        record = {**_key(key), "value": {"S": text}, "version": {"N": str(new)}}
        with self._call("PutItem", key, version):
            self.client.put_item(
                TableName=self.table, Item=record, **_condition(version, exists=False)
            )
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
        self, prefix: str, *, start_after: str | None = None, limit: int = base.MAX_QUERY_ITEMS
    ) -> list[Item]:
        space = base.namespace(prefix)[0]
        limit = max(0, min(limit, base.MAX_QUERY_ITEMS))
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
        while len(items) < limit:
            with self._call("Query"):
                page = self.client.query(**args, Limit=limit - len(items))
            items += [_item(found) for found in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                break
            args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return items[:limit]

    def ensure_table(self, *, wait_seconds: float = 120.0) -> bool:
        """Create the table (on demand) unless it exists and wait until it is ACTIVE;
        True if it was created here."""
        created = False
        with self._call("CreateTable"):
            try:
                self.client.describe_table(TableName=self.table)
            except self.client.exceptions.ResourceNotFoundException:
                self.client.create_table(
                    TableName=self.table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[
                        {"AttributeName": name, "AttributeType": "S"} for name in ("ns", "key")
                    ],
                    KeySchema=[
                        {"AttributeName": "ns", "KeyType": "HASH"},
                        {"AttributeName": "key", "KeyType": "RANGE"},
                    ],
                )
                created = True
            self.client.get_waiter("table_exists").wait(
                TableName=self.table,
                WaiterConfig={"Delay": 1, "MaxAttempts": max(1, int(wait_seconds))},
            )
        return created

    def close(self) -> None:
        self.client.close()


def _key(key: str) -> dict[str, Any]:
    return {"ns": {"S": base.namespace(key)[0]}, "key": {"S": key}}


def _item(found: Mapping[str, Any]) -> Item:
    return Item(found["key"]["S"], json.loads(found["value"]["S"]), int(found["version"]["N"]))


def _condition(version: int | None, *, exists: bool) -> dict[str, Any]:
    """A write's condition: at ``version``, or absent (None; a delete: no condition)."""
    if version is None and exists:
        return {}
    condition: dict[str, Any] = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
    if version is None:
        condition["ConditionExpression"] = "attribute_not_exists(#k)"
        condition["ExpressionAttributeNames"] = {"#k": "key"}
    else:
        condition["ConditionExpression"] = "#v = :v"
        condition["ExpressionAttributeNames"] = {"#v": "version"}
        condition["ExpressionAttributeValues"] = {":v": {"N": str(version)}}
    return condition
