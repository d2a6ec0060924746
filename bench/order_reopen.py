"""Per-entity order with 10 % failing attempts on the embedded broker, faithful and with
the test-only group reopening defect (``test_reopen_groups``), for one checkout's node.

Exact command (from the repo root)::

    python bench/order_reopen.py [--checkout PATH] [--entities 100] [--jobs 20]

``--checkout`` runs another tree's ``shardq`` (for the previous main's node over
today's broker: a copy of this tree with ``shardq/node.py``, ``executor.py``,
``heartbeat.py`` and ``testing.py`` taken from that commit, ``lane.py`` and
``leases.py`` removed). Each run: ``--entities`` x ``--jobs`` numbered jobs of the
ledger app (``tests/apps/ledger.py``, retry in 0.05 s) with ``fail_rate`` 0.1, one node
with 3 threads until empty, then the ledger check: entities whose first successes are
out of publish order, and lost jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, logging
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from shardq.core.config import Config
from shardq.broker import SqliteBroker
from shardq.run.node import Node
from tests.apps import ledger
from tests.apps.ledger import Ledgered
spec = json.loads(sys.argv[1])
broker = SqliteBroker(spec["db"], reopen_groups=spec["reopen"])
ledger.app.configure(Config(idle_wait_seconds=1), broker=broker)
n, e = spec["jobs"], spec["entities"]
Ledgered.publish_many(
    [(f"e{i}", {"n": j, "fail_rate": 0.1}) for j in range(n) for i in range(e)]
)
ledger.app.node(ledger.app.plan(threads=3), until_empty=True, seed=7).run()
found = ledger.check(ledger.read(os.environ["LEDGER_PATH"]), {f"e{i}": n for i in range(e)})
print(json.dumps({"out_of_order": len({o[0] for o in found["order"]}), "lost": len(found["lost"])}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", default=str(ROOT), help="tree whose shardq runs")
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    print(f"command: python bench/order_reopen.py {' '.join(sys.argv[1:])}")
    for reopen in (False, True):
        work = tempfile.mkdtemp(prefix="shardq-order-")
        spec = {
            "db": os.path.join(work, "broker.db"),
            "reopen": reopen,
            "entities": args.entities,
            "jobs": args.jobs,
        }
        env = {
            **os.environ,
            "PYTHONPATH": f"{args.checkout}{os.pathsep}{ROOT}",
            "LEDGER_PATH": os.path.join(work, "ledger.jsonl"),
        }
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            env=env,
            cwd=args.checkout,  # "" heads sys.path: the checkout's shardq is imported
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        mode = "reopening" if reopen else "faithful"
        print(
            f"{mode:10s} {args.entities} entities x {args.jobs} jobs: "
            f"{result['out_of_order']} entities out of order, {result['lost']} lost"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
