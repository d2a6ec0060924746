"""A state store in this process's memory (tests, ``memory://`` apps)."""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Mapping
from typing import Any

from shardq.store.base import MAX_QUERY_ITEMS, Item, Store, StoreConflict, encode, namespace


class MemoryStore(Store):
    """Items in a dict, kept sorted by key for queries."""

    kind = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[str, int]] = {}  # key -> (json, version)
        self._keys: list[str] = []

    def get(self, key: str) -> Item | None:
        namespace(key)
        with self._lock:
            found = self._items.get(key)
        return None if found is None else Item(key, json.loads(found[0]), found[1])

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        namespace(key)
        text = encode(value)
        with self._lock:
            found = self._items.get(key)
            current = None if found is None else found[1]
            if current != version:
                raise StoreConflict(_conflict(key, version, current))
            if found is None:
                bisect.insort(self._keys, key)
            new = 1 if current is None else current + 1
            self._items[key] = (text, new)
        return Item(key, json.loads(text), new)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        namespace(key)
        with self._lock:
            found = self._items.get(key)
            if found is None:
                if version is not None:
                    raise StoreConflict(_conflict(key, version, None))
                return False
            if version is not None and found[1] != version:
                raise StoreConflict(_conflict(key, version, found[1]))
            del self._items[key]
            self._keys.pop(bisect.bisect_left(self._keys, key))
        return True

    def query(
        self, prefix: str, *, start_after: str | None = None, limit: int = MAX_QUERY_ITEMS
    ) -> list[Item]:
        namespace(prefix)
        with self._lock:
            start = bisect.bisect_right(self._keys, start_after or "")
            start = max(start, bisect.bisect_left(self._keys, prefix))
            out: list[Item] = []
            for key in self._keys[start:]:
                if not key.startswith(prefix) or len(out) >= min(limit, MAX_QUERY_ITEMS):
                    break
                text, version = self._items[key]
                out.append(Item(key, json.loads(text), version))
        return out


def _conflict(key: str, expected: int | None, current: int | None) -> str:
    want = "absent" if expected is None else f"at version {expected}"
    now = "absent" if current is None else f"at version {current}"
    return f"store item {key!r} was expected {want} but is {now}"
