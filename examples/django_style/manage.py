"""Management commands, as in a Django project's ``manage.py``.

python examples/django_style/manage.py seed [--orders N]
python examples/django_style/manage.py shardq_run [any `shardq run` flag ...]
python examples/django_style/manage.py show
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from contextlib import closing

STATUSES = ["created", "paid", "shipped"]


def seed(argv: Sequence[str]) -> int:
    """Publish sample status changes from the "views"."""
    parser = argparse.ArgumentParser(prog="manage.py seed")
    parser.add_argument("--orders", type=int, default=5)
    args = parser.parse_args(argv)
    from shop import db, views

    db.migrate()
    for status in STATUSES:  # requests arrive interleaved; each order's stay in order
        for n in range(1, args.orders + 1):
            views.order_status_changed(n, status, customer=f"customer-{n % 3}")
    print(f"published {len(STATUSES) * args.orders} status changes for {args.orders} orders")
    return 0


def shardq_run(argv: Sequence[str]) -> int:
    """``shardq run`` for this project's app; every flag of ``shardq run`` passes through."""
    from shop import db, settings

    from shardq.ops.cli import main

    db.migrate()
    code = main(
        [
            "run",
            "--app",
            "shop.tasks:app",
            "--broker-url",
            settings.SHARDQ["broker_url"],
            "--threads",
            str(settings.SHARDQ["threads"]),
            *argv,  # after the settings, so a flag given here wins
        ]
    )
    print(db.connection.stats())
    return code


def show(argv: Sequence[str]) -> int:
    """Print the orders and the customer outbox."""
    from shop import db, settings

    db.migrate()
    with closing(sqlite3.connect(settings.DATABASES["default"]["NAME"])) as conn:
        for order, status, updates in conn.execute(
            "SELECT o.id, o.status, COUNT(e.id) FROM shop_order o"
            " JOIN shop_orderevent e ON e.order_id = o.id GROUP BY o.id ORDER BY o.id"
        ):
            print(f"{order}: {status} ({updates} updates)")
        for customer, message in conn.execute(
            "SELECT customer, message FROM shop_outbox ORDER BY id"
        ):
            print(f"outbox {customer}: {message}")
    return 0


COMMANDS = {"seed": seed, "shardq_run": shardq_run, "show": show}


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: manage.py {{{','.join(COMMANDS)}}} [args ...]", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
