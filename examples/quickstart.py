"""Publish jobs for two entities and run a node in-process until they are done.

    python examples/quickstart.py

Runs on the in-memory broker: nothing to install besides shardq, nothing left behind.
"""

from __future__ import annotations

import threading
from typing import Any

import shardq

app = shardq.App(shardq.Config(broker_url="memory://", idle_wait_seconds=1))
applied: list[tuple[str, str]] = []
lock = threading.Lock()


@app.register
class SyncOrder(shardq.Worker):
    shards = 4
    batch_size = 10

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        with lock:
            applied.extend((entity_id, p["status"]) for p in payloads)


def main() -> None:
    for status in ["created", "paid", "shipped"]:
        for order in ["order-42", "order-7"]:
            SyncOrder.publish(order, {"status": status})
    app.node(app.plan(threads=2), until_empty=True).run()
    for order in ["order-42", "order-7"]:
        print(order, " -> ".join(s for e, s in applied if e == order))


if __name__ == "__main__":
    main()
