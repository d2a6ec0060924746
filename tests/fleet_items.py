"""Fleet items written into an app's state store as its nodes would (for view tests)."""

from __future__ import annotations

from typing import Any

from shardq.store import Store


def heartbeat(
    store: Store,
    node: str,
    at: float,
    held: tuple[str, ...] = (),
    *,
    gone: str = "",
    gone_at: float = 0.0,
    mode: str = "elastic",
    **report: Any,
) -> None:
    """Write ``node``'s heartbeat (its report at ``at``); its elastic shards' owner
    items too, unless it is ``gone`` (then others have not taken them yet)."""
    value: dict[str, Any] = {
        "node": node,
        "host": f"ip-10-0-1-{len(node)}",
        "pid": 4100 + len(node),
        "started": at - 900,
        "at": at,
        "mode": mode,
        "held": list(held),
        "expire": 6.0,
        **report,
    }
    if gone:
        value.update(gone=gone, gone_at=gone_at)
    current = store.get(f"node/{node}")
    store.put(f"node/{node}", value, version=current.version if current else None)
    if mode == "elastic":
        for key in held:
            item = store.get(f"shard/{key}")
            store.put(f"shard/{key}", {"owner": node}, version=item.version if item else None)
