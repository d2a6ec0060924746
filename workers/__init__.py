"""Sample workers: what ``shardq run`` loads when no ``--app`` is given.

Importing this module does no I/O: it only defines an app and registers classes.
``python -m workers.samples`` publishes a batch of sample jobs for them.
"""

from __future__ import annotations

import random
from typing import Any

import structlog

import shardq

app = shardq.App()
log = structlog.get_logger("workers")


@app.register
class SyncOrder(shardq.Worker):
    """Applies status updates of one order in the order they were published.

    With ``batch_size = 10`` the consecutive updates of an order arrive together;
    only the latest state matters, so they are merged into one write.
    """

    shards = 4
    priority = 10
    batch_size = 10

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        steps = [p["step"] for p in payloads]
        if steps != sorted(steps):
            raise AssertionError(f"order {entity_id} got steps out of order: {steps}")
        log.debug("order.synced", order=entity_id, status=payloads[-1]["status"])


@app.register
class SendReceipt(shardq.Worker):
    """Sends a receipt e-mail; the mail service is flaky, so some attempts retry."""

    shards = 2
    priority = 1
    max_retries = 3

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        (payload,) = payloads
        if random.random() < payload.get("failure_rate", 0.0):
            raise shardq.Retry(delay=0.2)  # retried in 0.2 s, still before this customer's next
        log.debug("receipt.sent", customer=entity_id, order=payload["order"])
