"""The state store: a few versioned items with compare-and-set.

Fleet and layout state lives here, never in a message (SQS deletes messages older
than the retention). Keys are ``<namespace>/<rest>``; values are JSON objects.
Every write bumps an item's ``version`` (1 when new); :meth:`Store.put` writes only
if the item is at ``version`` (None: absent), else :class:`StoreConflict`. One
contract suite (``tests/test_store_contract.py``) runs on every implementation.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardq.core.errors import ShardqError

#: Largest encoded value an item may hold (DynamoDB's item limit is 400 KB, keys
#: and attribute names included).
MAX_VALUE_BYTES = 350 * 1024
#: Longest key, in UTF-8 bytes (DynamoDB's limit for a sort key).
MAX_KEY_BYTES = 1024
#: Most items one :meth:`Store.query` call returns.
MAX_QUERY_ITEMS = 1000


class StoreError(ShardqError):
    """The state store could not be read or written; the message names the call.
    Check the store (the DynamoDB table, or the embedded file) and try again."""


class StoreConflict(StoreError):
    """A conditional write found the item changed (or present, or gone) since it was
    read: read it again and decide again."""


@dataclass(frozen=True)
class Item:
    """A stored item: its key, its value (a JSON object) and its version (>= 1)."""

    key: str
    value: Mapping[str, Any]
    version: int


def namespace(key: str) -> tuple[str, str]:
    """``"node/ab12"`` -> ``("node", "ab12")``; a key without a namespace is refused."""
    space, slash, rest = key.partition("/")
    if not slash or not space:
        raise ValueError(f"store key {key!r} has no namespace: use '<namespace>/<rest>'")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"store key {key[:40]!r}... is over {MAX_KEY_BYTES} bytes; shorten it")
    return space, rest


def encode(value: Mapping[str, Any]) -> str:
    """The value as compact JSON; too large or not JSON raises ValueError."""
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"store value is not a JSON object: {exc}") from None
    if not text.startswith("{"):
        raise ValueError("store value must be a JSON object")
    if len(text.encode("utf-8")) > MAX_VALUE_BYTES:
        raise ValueError(f"store value is over {MAX_VALUE_BYTES} bytes; split it")
    return text


def conflict(key: str, expected: int | None, current: int | None) -> str:
    """The message of a failed compare-and-set."""
    want = "absent" if expected is None else f"at version {expected}"
    now = "absent" if current is None else f"at version {current}"
    return f"store item {key!r} was expected {want} but is {now}; read it again and decide again"


class Store(abc.ABC):
    """Versioned items with compare-and-set. Thread-safe."""

    #: ``memory``, ``sqlite`` or ``dynamodb`` (for logs and views).
    kind: str = "store"

    @abc.abstractmethod
    def get(self, key: str) -> Item | None:
        """The item, or None if there is none (a strongly consistent read)."""

    @abc.abstractmethod
    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        """Write ``value`` if the item is at ``version`` (None: if it does not exist);
        returns the item written (its version one higher). Raises StoreConflict."""

    @abc.abstractmethod
    def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete the item (only at ``version`` if given: else StoreConflict); False if
        there was none."""

    @abc.abstractmethod
    def query(
        self, prefix: str, *, start_after: str | None = None, limit: int = MAX_QUERY_ITEMS
    ) -> list[Item]:
        """Items whose key starts with ``prefix`` (which includes its namespace and
        slash), in key order, after ``start_after``, at most ``limit``."""

    def query_all(self, prefix: str) -> list[Item]:
        """Every item under ``prefix`` (pages through :meth:`query`)."""
        items: list[Item] = []
        after: str | None = None
        while True:
            page = self.query(prefix, start_after=after)
            items += page
            if len(page) < MAX_QUERY_ITEMS:
                return items
            after = page[-1].key

    def ensure_table(self, *, wait_seconds: float = 120.0) -> bool:
        """Create what the store keeps its items in, unless it exists; True if it was
        created here. (The embedded and memory stores make theirs when opened.)"""
        return False

    def close(self) -> None:  # noqa: B027 - optional for implementations
        """Release connections (optional)."""
