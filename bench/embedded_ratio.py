"""A node against its raw broker on the embedded (SQLite file) broker, in one run:
node jobs/s as a fraction of what the broker alone does, optionally base vs current.

Exact command (from the repo root)::

    python bench/embedded_ratio.py --jobs 20000 --entities 1000 --shards 8 --threads 4

With ``--base-rev 197a6ab`` (``git archive`` of that revision in a temporary
directory) or ``--base PATH`` the base checkout is measured too, alternating with the
current one (``--current PATH``, default this checkout) for ``--rounds`` rounds (base
first in odd rounds, current first in even ones), and
the table gets a current/base row. Each side runs in its own child process with
``PYTHONPATH=<checkout>:bench`` (``bench/_sides.py``, ``bench/_side_child.py``).

Per side and round, three phases, each on a fresh SQLite file in a temp directory,
each after ``publish_many`` of the same ``--jobs`` blank jobs (``bench/lane_worker.py``
``Blank``, job i for ``entity-{i % entities}``, over ``--shards`` shard queues; not
timed):

* ``raw-1``: the broker alone, one thread: per shard queue, ``send_batch`` of the
  same bodies 10 at a time, then ``receive`` 10 (no wait) and ``delete_batch`` them
  until the queue is empty: the broker's work for each job (send + receive + delete);
* ``raw-T``: the same with ``--threads`` threads, thread i owning queues i, i+T, ...;
* ``node``: ``app.node(app.plan(threads=T), until_empty=True).run()`` with the log
  set up as ``shardq run`` does by default: ``shardq.ops.logs.configure(format, level)``
  with the defaults of ``shardq.Config`` (auto, i.e. JSON when not a terminal, at
  info: one event per job) to stderr, which goes to a file in the temp directory.

Figures: jobs/s (node: to the end of its last ``perform``; ``wall``: until ``run()``
returns, with the until-empty detection and shutdown), CPU ms per job (user + sys of
the child around the phase), the ratios node / raw-1 and node / raw-T, and log lines
per job (to see the info level was on). Nothing is written to the repository.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any

from _common import machine, table
from _sides import add_side_args, command_line, in_turn, median, ratio, run_child, sides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per phase (20000)")
    parser.add_argument("--entities", type=int, default=1000, help="distinct entities (1000)")
    parser.add_argument("--shards", type=int, default=8, help="shards of the worker (8)")
    parser.add_argument("--threads", type=int, default=4, help="node and raw-T threads (4)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of base, current (1)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (node logs)")
    add_side_args(parser, base_by_default=False)
    args = parser.parse_args()
    if min(args.jobs, args.entities, args.shards, args.threads, args.rounds) < 1:
        parser.error("--jobs, --entities, --shards, --threads and --rounds must be >= 1")

    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(
        f"jobs={args.jobs} entities={args.entities} shards={args.shards} "
        f"threads={args.threads} rounds={args.rounds}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="embedded-ratio-")
    try:
        with sides(args) as pair:
            for side in pair:
                print(f"{side.name}: {side.label}", flush=True)
            runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in pair}
            for rnd in range(args.rounds):
                for side in in_turn(pair, rnd):
                    work = os.path.join(tmp, f"{side.name}-{rnd}")
                    os.mkdir(work)
                    spec = {
                        "cmd": "embedded",
                        "dir": work,
                        "jobs": args.jobs,
                        "entities": args.entities,
                        "shards": args.shards,
                        "threads": args.threads,
                    }
                    log = os.path.join(work, "node.log")
                    res = run_child(side, spec, log)
                    with open(log) as f:
                        res["log_lines"] = sum(1 for _ in f)
                    runs[side.name].append(res)
                    f_ = figures(res, args.threads)
                    print(
                        f"  round {rnd + 1} {side.name:7s} (shardq from {res['shardq']}, "
                        f"log {res['log']}): raw-1 {f_['raw1']:,.0f} jobs/s, "
                        f"raw-{args.threads} {f_['rawT']:,.0f} jobs/s, node {f_['node']:,.0f} "
                        f"jobs/s (wall {f_['wall']:.2f} s, exit {res['node']['code']}, "
                        f"processed {res['node']['processed']}/{args.jobs})",
                        flush=True,
                    )
        print(f"\nmedian of {args.rounds} round(s) per side")
        print(summary(runs, args.threads, args.jobs))
        print(f"\nmachine after: {machine()}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def figures(res: dict[str, Any], threads: int) -> dict[str, float]:
    def rate(phase: dict[str, Any]) -> float:
        return float(phase["processed"] / phase["busy_s"]) if phase["busy_s"] > 0 else 0.0

    raw1, raw_t, node = res["raw-1"], res[f"raw-{threads}"], res["node"]
    jobs = max(1, node["processed"])
    return {
        "raw1": rate(raw1),
        "rawT": rate(raw_t),
        "node": rate(node),
        "wall": node["run_s"],
        "node_cpu": node["cpu_s"] * 1000.0 / jobs,
        "raw1_cpu": raw1["cpu_s"] * 1000.0 / max(1, raw1["processed"]),
        "log": res["log_lines"] / jobs,
    }


def summary(runs: dict[str, list[dict[str, Any]]], threads: int, jobs: int) -> str:
    keys = ("raw1", "rawT", "node", "wall", "node_cpu", "raw1_cpu", "log")
    med = {
        name: {k: median([figures(r, threads)[k] for r in rs]) for k in keys}
        for name, rs in runs.items()
    }
    headers = [
        "side",
        "raw-1 jobs/s",
        f"raw-{threads} jobs/s",
        "node jobs/s",
        "node/raw-1",
        f"node/raw-{threads}",
        "node wall s",
        "node CPU ms/job",
        "raw-1 CPU ms/job",
        "log lines/job",
    ]
    rows = []
    for name, m in med.items():
        rows.append(
            [
                name,
                f"{m['raw1']:,.0f}",
                f"{m['rawT']:,.0f}",
                f"{m['node']:,.0f}",
                ratio(m["node"], m["raw1"]),
                ratio(m["node"], m["rawT"]),
                f"{m['wall']:.2f}",
                f"{m['node_cpu']:.3f}",
                f"{m['raw1_cpu']:.3f}",
                f"{m['log']:.2f}",
            ]
        )
    if "base" in med:
        b, c = med["base"], med["current"]
        rows.append(
            [
                "current/base",
                ratio(c["raw1"], b["raw1"]),
                ratio(c["rawT"], b["rawT"]),
                ratio(c["node"], b["node"]),
                "",
                "",
                ratio(c["wall"], b["wall"]),
                ratio(c["node_cpu"], b["node_cpu"]),
                ratio(c["raw1_cpu"], b["raw1_cpu"]),
                "",
            ]
        )
    return table(headers, rows)


if __name__ == "__main__":
    main()
