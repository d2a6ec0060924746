"""The worker behind the web publisher: apply an order's status changes, in order.

Files: the broker is ``$SHARDQ_BROKER_URL``; the orders database is ``orders.db`` in
``$WEB_PUBLISHER_DIR`` (default: ``shardq-web-publisher`` in the system temp directory).

    python -m examples.web_publisher.tasks      # print the orders table
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import shardq

DATA_DIR = Path(
    os.environ.get("WEB_PUBLISHER_DIR") or Path(tempfile.gettempdir()) / "shardq-web-publisher"
)
ORDERS_DB = DATA_DIR / "orders.db"

app = shardq.App()  # config from shardq.yaml / SHARDQ_* variables, as `shardq run` reads it


def connect() -> sqlite3.Connection:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(ORDERS_DB, timeout=30)
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS orders (
            order_id TEXT PRIMARY KEY, status TEXT NOT NULL, history TEXT NOT NULL,
            updated_at REAL NOT NULL);
        """
    )
    return db


@app.register
class ApplyOrderStatus(shardq.Worker):
    """Entity = order id: one order's changes apply one after another, in publish order."""

    shards = 4

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        with closing(connect()) as db, db:
            for change in payloads:
                db.execute(
                    "INSERT INTO orders (order_id, status, history, updated_at)"
                    " VALUES (?1, ?2, ?2, ?3) ON CONFLICT (order_id) DO UPDATE SET"
                    " status = ?2, history = history || ' -> ' || ?2, updated_at = ?3",
                    (entity_id, change["status"], time.time()),
                )


def main() -> None:
    with closing(connect()) as db:
        for order_id, history in db.execute("SELECT order_id, history FROM orders ORDER BY 1"):
            print(f"{order_id}: {history}")


if __name__ == "__main__":
    main()
