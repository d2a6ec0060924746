"""What a node reads of items it does not own: nodes of other apps sharing the store,
damaged items (each logged once), and heartbeat values it writes back (its own, within
the store's size limit; another's, marked gone)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import structlog

from shardq.core.fleet_rules import Beat, live_nodes, observe
from shardq.core.heartbeat import Heartbeat, marked_gone, prefix_of
from shardq.store import Item, Store, StoreError
from shardq.store.base import encode

log = structlog.get_logger("shardq.fleet")


class Foreign:
    """The nodes of other apps sharing this store (not supported: logged once a prefix)."""

    def __init__(self, expire_seconds: float) -> None:
        self.expire_seconds = expire_seconds
        self._seen: dict[str, tuple[int, float]] = {}
        self._logged: set[str] = set()  # their prefixes

    def live(self, now: float, answered: float, items: dict[str, Item]) -> set[str]:
        """Of the heartbeats ``items`` (by node; read asked at ``now``, answered at
        ``answered``), the nodes live at ``now``: each judged on the lease of its own app,
        when longer, on this node's clock."""
        beats = {n: Beat(n, i.version, gone=str(i.value.get("gone", ""))) for n, i in items.items()}
        self._seen = observe(self._seen, beats, answered)
        live: set[str] = set()
        for name, beat in beats.items():
            expire = max(self.expire_seconds, Heartbeat.from_value(name, items[name].value).expire)
            live |= live_nodes({name: beat}, self._seen, now, expire)
        for prefix in sorted({str(items[n].value.get("prefix")) for n in live} - self._logged):
            self._logged.add(prefix)
            log.error(
                "fleet.store_shared",
                prefix=prefix,
                detail="another app's nodes use this state store: not supported; give each "
                "app its own table (the default name is per queue_prefix); shards their node "
                "owns are left alone",
            )
        return live


class Damaged:
    """Logs each damaged item once (again if it changes): nodes rewrite it."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # item key -> version last reported damaged

    def report(self, items: list[Item]) -> None:
        for item in items:
            if item.damaged and self._seen.get(item.key) != item.version:
                log.error(
                    "fleet.item_damaged",
                    item=item.key,
                    error=item.damaged,
                    detail="nodes rewrite it: a heartbeat at its node's next beat, else once "
                    "it stood still for a lease; an ownership item at once if its holder is "
                    "live, else once it stood still for a lease",
                )
        self._seen = {i.key: i.version for i in items if i.damaged}


def fit(report: dict[str, Any]) -> dict[str, Any]:
    """The report within the store's size limit: without its lags, then its shards, if
    they take it over (a node holding thousands of shards of long worker names), naming
    what it left out."""
    omitted: list[str] = []
    for drop in ("lags", "held"):
        with suppress(ValueError):
            encode(report)
            return report
        omitted.append(drop)
        report = {**report, drop: type(report[drop])(), "omitted": list(omitted)}
    return report


def gone_value(value: Mapping[str, Any], at: float, by: str) -> dict[str, Any]:
    """A heartbeat's value marked gone (by node ``by`` at wall time ``at``); for one it
    cannot write back (a NaN, near the size limit), an empty one keeping its prefix (the
    node stays out of other apps' views)."""
    marked = marked_gone(value, "lease expired", at, by)
    try:
        encode(marked)
    except ValueError:
        prefix = prefix_of(value)
        return marked_gone({} if prefix is None else {"prefix": prefix}, "lease expired", at, by)
    return marked


def mark_gone(store: Store, item: Item, at: float, by: str) -> None:
    """Mark the heartbeat ``item`` gone (node ``by``, wall time ``at``), on its version."""
    try:
        store.put(item.key, gone_value(item.value, at, by), version=item.version)
    except StoreError:
        return
    log.warning("fleet.node_gone", node=item.key.partition("/")[2], reason="lease expired")
