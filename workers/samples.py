"""Publish sample jobs for the sample workers: ``python -m workers.samples [ORDERS]``."""

from __future__ import annotations

import sys

from workers import SendReceipt, SyncOrder

STATUSES = ["created", "paid", "packed", "shipped", "delivered"]


def main(orders: int = 200) -> None:
    updates = [
        (f"order-{n}", {"step": step, "status": status})
        for n in range(orders)
        for step, status in enumerate(STATUSES)
    ]
    SyncOrder.publish_many(updates)
    SendReceipt.publish_many(
        [
            (f"customer-{n % 50}", {"order": f"order-{n}", "failure_rate": 0.1})
            for n in range(orders)
        ]
    )
    print(f"published {len(updates)} SyncOrder and {orders} SendReceipt jobs", file=sys.stderr)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
