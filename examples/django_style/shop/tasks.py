"""The shardq app and its workers (in a Django project: ``<app>/tasks.py``)."""

from __future__ import annotations

from typing import Any

import shardq
from shop import settings
from shop.db import connection
from shop.middleware import CloseDbConnections

app = shardq.App(shardq.Config(**settings.SHARDQ))
if settings.CLOSE_DB_CONNECTIONS:
    app.add_middleware(CloseDbConnections())


@app.register
class UpdateOrderStatus(shardq.Worker):
    """Apply an order's status changes, in order (entity = the order)."""

    shards = 4

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for update in payloads:
            with connection.atomic() as db:
                db.execute(
                    "INSERT INTO shop_order (id, status, customer) VALUES (?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET status = excluded.status",
                    (entity_id, update["status"], update["customer"]),
                )
                db.execute(
                    "INSERT INTO shop_orderevent (order_id, status, connection) VALUES (?, ?, ?)",
                    (entity_id, update["status"], connection.serial),
                )
            # after the commit, as with transaction.on_commit
            if update["status"] == "shipped":
                NotifyCustomer.publish(update["customer"], {"text": f"{entity_id} is on its way"})


@app.register
class NotifyCustomer(shardq.Worker):
    """Queue a message to a customer (entity = the customer: their messages stay in order)."""

    shards = 2

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        with connection.atomic() as db:
            db.executemany(
                "INSERT INTO shop_outbox (customer, message, connection) VALUES (?, ?, ?)",
                [(entity_id, p["text"], connection.serial) for p in payloads],
            )
