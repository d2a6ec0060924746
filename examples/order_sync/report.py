"""Compare what was published with what the worker wrote.

    python -m examples.order_sync.report

Exits 1 if an order's stored state is not its last published status.
"""

from __future__ import annotations

import sys
from contextlib import closing

from examples.order_sync.store import connect


def main() -> int:
    with closing(connect()) as db:
        rows = db.execute(
            "SELECT p.order_id, p.version, p.status, p.updates, o.version, o.status,"
            " o.writes, o.updates FROM published p LEFT JOIN orders o USING (order_id)"
            " ORDER BY length(p.order_id), p.order_id"
        ).fetchall()
    published = sum(r[3] for r in rows)
    applied = sum(r[7] or 0 for r in rows)
    writes = sum(r[6] or 0 for r in rows)
    matching = 0
    for order, version, status, updates, got_version, got_status, order_writes, _ in rows:
        ok = (got_version, got_status) == (version, status)
        matching += ok
        print(
            f"{order}: {updates} updates -> {order_writes or 0} writes;"
            f" stored v{got_version} {got_status}, last published v{version} {status}"
            + ("" if ok else "  MISMATCH")
        )
    print(
        f"\n{published} updates published, {applied} applied in {writes} writes"
        f" ({applied - writes} merged away, {applied / max(writes, 1):.1f} updates per write)"
    )
    print(f"{matching} of {len(rows)} orders hold their last published status")
    return 0 if matching == len(rows) and rows else 1


if __name__ == "__main__":
    sys.exit(main())
