"""Publish bursts of status updates: several updates of one order in a row.

    python -m examples.order_sync.publish [--orders 10] [--bursts 3] [--max-burst 20] [--seed 1]

Each update carries the order's next version and a status. The last published version
and status of each order are recorded, so ``report`` can check the end state.
"""

from __future__ import annotations

import argparse
import random
from contextlib import closing

from examples.order_sync.orders import SyncOrderState
from examples.order_sync.store import connect

STATUSES = ["pending", "paid", "packed", "shipped", "delivered", "returned"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.order_sync.publish")
    parser.add_argument("--orders", type=int, default=10)
    parser.add_argument("--bursts", type=int, default=3, help="bursts per order")
    parser.add_argument("--max-burst", type=int, default=20, help="most updates in a burst")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    total = 0
    with closing(connect()) as db:
        version = dict(db.execute("SELECT order_id, version FROM published").fetchall())
        for _ in range(args.bursts):
            for n in range(args.orders):
                order = f"order-{n}"
                first = version.get(order, 0) + 1
                burst = [
                    (order, {"version": v, "status": rng.choice(STATUSES)})
                    for v in range(first, first + rng.randint(1, args.max_burst))
                ]
                SyncOrderState.publish_many(burst)
                last = burst[-1][1]
                version[order] = last["version"]
                with db:
                    db.execute(
                        "INSERT INTO published (order_id, version, status, updates, bursts)"
                        " VALUES (?1, ?2, ?3, ?4, 1) ON CONFLICT (order_id) DO UPDATE SET"
                        " version = ?2, status = ?3, updates = updates + ?4, bursts = bursts + 1",
                        (order, last["version"], last["status"], len(burst)),
                    )
                total += len(burst)
    print(f"published {total} updates of {args.orders} orders in {args.bursts} bursts each")


if __name__ == "__main__":
    main()
