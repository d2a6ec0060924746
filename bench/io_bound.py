"""I/O-bound jobs (each waits a fixed time) over many entities and few shards, base
vs current in one run, on the embedded broker and on ministack behind a latency proxy.

Exact command (from the repo root)::

    python bench/io_bound.py --jobs 4000 --entities 400 --shards 8 --threads 8 \
        --concurrency 200 --sleep-ms 50 --base-rev 59cca7c

Each side runs in its own child process (``bench/_sides.py``, ``bench/_side_child.py``
``io``): ``publish_many`` of ``--jobs`` jobs (job i for ``entity-{i % entities}``), then
``app.node(app.plan(threads=T), until_empty=True).run()`` with ``concurrency`` set
(a side without that setting runs as it does: one job per thread at a time). The
workers are ``bench/lane_worker.py`` ``Sleep`` (``time.sleep``) and ``SleepAsync``
(``await asyncio.sleep``; only on a side that knows ``concurrency``: an older side would
not await it). Figures: jobs/s up to the end of the last job, most jobs running at
once (counted by the workers), CPU ms per job, and on SQS the requests per 1,000 jobs
(publish + process) counted by ``bench/peers/proxy.py --latency-ms``, which adds the
latency to every request in front of one ministack (``tests/emulator.py``); both are
started here on 127.0.0.1 and stopped by pid. ``--brokers sqlite,sqs`` picks the
brokers, ``--kinds sync,async`` the workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import uuid
from typing import Any

from _common import machine, table
from _sides import (
    add_side_args,
    command_line,
    emulator_behind_proxy,
    in_turn,
    median,
    ratio,
    run_child,
    sides,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per run (4000)")
    parser.add_argument("--entities", type=int, default=400, help="distinct entities (400)")
    parser.add_argument("--shards", type=int, default=8, help="shards of the worker (8)")
    parser.add_argument("--threads", type=int, default=8, help="node threads (8)")
    parser.add_argument("--concurrency", type=int, default=200, help="node concurrency (200)")
    parser.add_argument("--sleep-ms", type=int, default=50, help="each job's wait (50)")
    parser.add_argument("--brokers", default="sqlite,sqs", help="sqlite, sqs or both")
    parser.add_argument("--kinds", default="sync,async", help="sync, async or both")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="proxy latency (20)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of base, current (1)")
    add_side_args(parser, base_by_default=False)
    args = parser.parse_args()
    brokers = [b for b in args.brokers.split(",") if b]
    kinds = [k for k in args.kinds.split(",") if k]
    if not set(brokers) <= {"sqlite", "sqs"} or not set(kinds) <= {"sync", "async"}:
        parser.error("--brokers takes sqlite and/or sqs, --kinds sync and/or async")
    if min(args.jobs, args.entities, args.shards, args.threads, args.concurrency) < 1:
        parser.error("--jobs, --entities, --shards, --threads, --concurrency must be >= 1")

    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(
        f"jobs={args.jobs} entities={args.entities} shards={args.shards} threads={args.threads} "
        f"concurrency={args.concurrency} sleep={args.sleep_ms} ms rounds={args.rounds}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="io-bound-")
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        with sides(args) as pair:
            for side in pair:
                print(f"{side.name}: {side.label}", flush=True)
            for broker in brokers:
                if broker == "sqs":
                    with emulator_behind_proxy(args.latency_ms, tmp) as up:
                        extra = {"endpoint": up.endpoint, "port": up.port}
                        measure(args, pair, broker, kinds, extra, tmp, rows)
                else:
                    measure(args, pair, broker, kinds, {}, tmp, rows)
        print(f"\nmedian of {args.rounds} round(s) per side")
        print(summary(rows, args.jobs))
        print(f"\nmachine after: {machine()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(
    args: argparse.Namespace,
    pair: list[Any],
    broker: str,
    kinds: list[str],
    extra: dict[str, Any],
    tmp: str,
    rows: dict[tuple[str, str, str], list[dict[str, Any]]],
) -> None:
    for kind in kinds:
        for rnd in range(args.rounds):
            for side in in_turn(pair, rnd):
                if kind == "async" and side.name == "base":
                    continue  # the base may not await an async perform
                work = os.path.join(tmp, f"{broker}-{kind}-{side.name}-{rnd}")
                os.mkdir(work)
                spec = {
                    "cmd": "io",
                    "broker": broker,
                    "kind": kind,
                    "dir": work,
                    "prefix": f"io{uuid.uuid4().hex[:6]}-",
                    "jobs": args.jobs,
                    "entities": args.entities,
                    "shards": args.shards,
                    "threads": args.threads,
                    "concurrency": args.concurrency,
                    "sleep_ms": args.sleep_ms,
                    **extra,
                }
                res = run_child(side, spec, os.path.join(work, "node.log"))
                rows.setdefault((broker, kind, side.name), []).append(res)
                f = figures(res)
                print(
                    f"  {broker} {kind} round {rnd + 1} {side.name:7s}: {f['rate']:,.0f} jobs/s, "
                    f"peak {res['peak']} at once, {f['cpu']:.2f} CPU ms/job, "
                    + (f"{f['requests']:.0f} requests/1,000 jobs, " if extra else "")
                    + f"exit {res['code']}, processed {res['processed']}/{args.jobs}",
                    flush=True,
                )
                if extra:
                    print(f"    publish {res['publish_requests']}", flush=True)
                    print(f"    process {res['process_requests']}", flush=True)


def figures(res: dict[str, Any]) -> dict[str, float]:
    jobs = max(1, res["processed"])
    # "ReceiveMessage:empty" and ":with-messages" split ReceiveMessage: not counted twice
    requests = sum(
        n
        for counts in (res["publish_requests"], res["process_requests"])
        for op, n in counts.items()
        if ":" not in op
    )
    return {
        "rate": res["processed"] / res["busy_s"] if res["busy_s"] > 0 else 0.0,
        "cpu": res["cpu_s"] * 1000.0 / jobs,
        "requests": requests * 1000.0 / jobs,
        "peak": float(res["peak"]),
    }


def summary(rows: dict[tuple[str, str, str], list[dict[str, Any]]], jobs: int) -> str:
    out = []
    med = {
        key: {k: median([figures(r)[k] for r in rs]) for k in ("rate", "cpu", "requests", "peak")}
        for key, rs in rows.items()
    }
    for (broker, kind, side), m in med.items():
        base = med.get((broker, "sync", "base"))
        out.append(
            [
                broker,
                kind,
                side,
                f"{m['rate']:,.0f}",
                f"{m['peak']:.0f}",
                f"{m['cpu']:.2f}",
                f"{m['requests']:.0f}" if broker == "sqs" else "",
                ratio(m["rate"], base["rate"]) if base and side != "base" else "",
            ]
        )
    headers = [
        "broker",
        "worker",
        "side",
        "jobs/s",
        "most at once",
        "CPU ms/job",
        "requests/1,000 jobs",
        "x base sync",
    ]
    return table(headers, out)


if __name__ == "__main__":
    main()
