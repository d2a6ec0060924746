"""The state store: versioned JSON items keyed ``<namespace>/<rest>``, with compare-and-set
(every write bumps ``version``, 1 when new). Contract: tests/test_store_contract.py."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardq.core.errors import ShardqError

#: Largest encoded value (DynamoDB's item limit, 400 KB, counts keys and names too).
MAX_VALUE_BYTES = 350 * 1024
#: Longest key, in UTF-8 bytes (DynamoDB's limit for a sort key).
MAX_KEY_BYTES = 1024
#: What the message of a DamagedItem tells to do.
FIX = "fix or delete it in the state store"
#: Most items one :meth:`Store.query` call returns.
MAX_QUERY_ITEMS = 1000


class StoreError(ShardqError):
    """The state store could not be read or written; the message names the call."""


class StoreConflict(StoreError):
    """A conditional write found the item changed since it was read."""


class DamagedItem(ShardqError):
    """An item's stored value is not a JSON object (a damaged file, a hand edit): not
    a store outage that passes, so never retried as one; the message names the item."""


@dataclass(frozen=True)
class Item:
    key: str
    value: Mapping[str, Any]
    version: int
    damaged: str = ""  # why the stored value cannot be read (``value`` is then empty)


def namespace(key: str) -> tuple[str, str]:
    space, slash, rest = key.partition("/")
    if not slash or not space:
        raise ValueError(f"store key {key!r} has no namespace: use '<namespace>/<rest>'")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"store key {key[:40]!r}... is over {MAX_KEY_BYTES} bytes; shorten it")
    return space, rest


def encode(value: Mapping[str, Any]) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"store value is not a JSON object: {exc}") from None
    if not text.startswith("{"):
        raise ValueError("store value must be a JSON object")
    if len(text.encode("utf-8")) > MAX_VALUE_BYTES:
        raise ValueError(f"store value is over {MAX_VALUE_BYTES} bytes; split it")
    return text


def decode(key: str, text: Any) -> Mapping[str, Any]:
    """The stored value of item ``key``; DamagedItem naming it if it is not a JSON object."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        why = "no value" if text is None else f"not JSON: {exc}"
    else:
        if isinstance(value, dict):
            return value
        kinds = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}
        why = f"{kinds.get(type(value), 'a number')}, not a JSON object"
    raise DamagedItem(f"store item {key!r} is damaged ({why}); {FIX}")


def item(key: str, text: Any, version: Any, *, keep_damaged: bool = False) -> Item:
    """Item ``key`` as stored; a damaged value raises DamagedItem or, ``keep_damaged``,
    comes back empty with ``damaged`` saying why (version 0 if the version cannot be
    read either: shardq writes no item at version 0)."""
    if isinstance(version, str) and version.isascii() and version.isdigit():
        version = int(version)  # DynamoDB's numbers come as text
    number = version if type(version) is int and version >= 1 else None
    try:
        if number is None:  # SQLite keeps whatever type a hand edit wrote
            why = f"version {version!r} is not a whole number >= 1"
            raise DamagedItem(f"store item {key!r} is damaged ({why}); {FIX}")
        return Item(key, decode(key, text), number)
    except DamagedItem as exc:
        if not keep_damaged:
            raise
        return Item(key, {}, number or 0, damaged=str(exc))


def conflict(key: str, expected: int | None, current: object) -> str:
    want = "absent" if expected is None else f"at version {expected}"
    now = "absent" if current is None else f"at version {current}"
    return f"store item {key!r} was expected {want} but is {now}; read it again and decide again"


class Store(abc.ABC):
    """Versioned items with compare-and-set. Thread-safe."""

    kind: str = "store"

    @abc.abstractmethod
    def get(self, key: str) -> Item | None:
        """The item, or None if there is none (a strongly consistent read)."""

    @abc.abstractmethod
    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        """Write ``value`` if the item is at ``version`` (None: absent), else StoreConflict."""

    @abc.abstractmethod
    def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete the item (at ``version`` if given, else StoreConflict); False if none."""

    @abc.abstractmethod
    def query(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int = MAX_QUERY_ITEMS,
        keep_damaged: bool = False,
    ) -> list[Item]:
        """Items under ``prefix`` (namespace included) in key order after ``start_after``;
        a damaged one raises DamagedItem, or is kept (see :func:`item`)."""

    def query_all(self, prefix: str, *, keep_damaged: bool = False) -> list[Item]:
        items: list[Item] = []
        after: str | None = None
        while True:
            page = self.query(prefix, start_after=after, keep_damaged=keep_damaged)
            items += page
            if len(page) < MAX_QUERY_ITEMS:
                return items
            after = page[-1].key

    def ensure_table(self) -> bool:
        """Create the table unless it exists; True if created here (SQLite: when opened)."""
        return False

    def close(self) -> None:  # noqa: B027 - optional for implementations
        pass
