"""A per-thread SQLite connection, like ``django.db.connection``.

``connection`` opens the calling thread's connection on first use and keeps it until
``close_old_connections()`` closes it. It counts opens and closes so the example can
show what the ``CloseDbConnections`` middleware does.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager

from shop import settings


class ConnectionHandler:
    """The calling thread's connection to ``settings.DATABASES["default"]``."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.opened = 0
        self.closed = 0

    def get(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(settings.DATABASES["default"]["NAME"], timeout=30)
            with self._lock:
                self.opened += 1
                self._local.serial = self.opened
            self._local.conn = conn
        return conn

    @property
    def serial(self) -> int:
        """Number of this thread's current connection (1 = the first one opened)."""
        self.get()
        return int(self._local.serial)

    @contextmanager
    def atomic(self) -> Iterator[sqlite3.Connection]:
        """A transaction on this thread's connection (like ``transaction.atomic``)."""
        conn = self.get()
        with conn:  # commits, or rolls back on an exception
            yield conn

    def close(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()
            with self._lock:
                self.closed += 1

    def stats(self) -> str:
        left = self.opened - self.closed
        return f"db connections: {self.opened} opened, {self.closed} closed, {left} left open"


connection = ConnectionHandler()


def close_old_connections() -> None:
    """Close this thread's connection, as ``django.db.close_old_connections`` does with
    ``CONN_MAX_AGE = 0`` (the next query opens a fresh one)."""
    connection.close()


def migrate() -> None:
    """Create the tables (on a connection of its own, not counted)."""
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(settings.DATABASES["default"]["NAME"], timeout=30)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS shop_order (
                id TEXT PRIMARY KEY, status TEXT NOT NULL, customer TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS shop_orderevent (
                id INTEGER PRIMARY KEY, order_id TEXT NOT NULL, status TEXT NOT NULL,
                connection INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS shop_outbox (
                id INTEGER PRIMARY KEY, customer TEXT NOT NULL, message TEXT NOT NULL,
                connection INTEGER NOT NULL);
            """
        )
