"""The order store (SQLite): current state per order, and what was published.

It lives in ``orders.db`` in ``$ORDER_SYNC_DIR`` (default: ``shardq-order-sync`` in the
system temp directory).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

DATA_DIR = Path(
    os.environ.get("ORDER_SYNC_DIR") or Path(tempfile.gettempdir()) / "shardq-order-sync"
)


def connect() -> sqlite3.Connection:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(DATA_DIR / "orders.db", timeout=30)
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS orders (          -- written by the worker
            order_id TEXT PRIMARY KEY, version INTEGER NOT NULL, status TEXT NOT NULL,
            writes INTEGER NOT NULL, updates INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS published (       -- written by the publisher
            order_id TEXT PRIMARY KEY, version INTEGER NOT NULL, status TEXT NOT NULL,
            updates INTEGER NOT NULL, bursts INTEGER NOT NULL);
        """
    )
    return db
