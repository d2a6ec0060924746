"""Keep each order's latest state: merge an order's queued updates and write once.

shardq run --app examples.order_sync.orders --until-empty --log-level warning
"""

from __future__ import annotations

import sys
import threading
from contextlib import closing
from typing import Any

import shardq
from examples.order_sync.store import connect

app = shardq.App()  # config from shardq.yaml / SHARDQ_* variables, as `shardq run` reads it
_print_lock = threading.Lock()


@app.register
class SyncOrderState(shardq.Worker):
    """Only an order's latest state matters, so apply the last of its queued updates.

    With ``batch_size = 10``, one ``perform`` call gets up to 10 consecutive updates of one
    order (oldest first). Merging them (later fields win) and writing once gives the same
    end state as 10 writes. The version check keeps a replayed, older batch
    (at-least-once delivery) from overwriting a newer state.
    """

    shards = 4
    batch_size = 10

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        merged: dict[str, Any] = {}
        for update in payloads:
            merged.update(update)
        with closing(connect()) as db, db:
            db.execute(
                "INSERT INTO orders (order_id, version, status, writes, updates)"
                " VALUES (?1, ?2, ?3, 1, ?4) ON CONFLICT (order_id) DO UPDATE SET"
                " version = ?2, status = ?3, writes = writes + 1, updates = updates + ?4"
                " WHERE ?2 > orders.version",
                (entity_id, merged["version"], merged["status"], len(payloads)),
            )
        with _print_lock:
            print(
                f"{entity_id}: merged {len(payloads)} update{'s' * (len(payloads) != 1)}"
                " into 1 write"
                f" -> v{merged['version']} {merged['status']}",
                file=sys.stdout,
                flush=True,
            )
