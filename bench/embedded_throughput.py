"""Throughput of one node on the embedded SQLite broker, with blank jobs.

Goal: embedded broker, one node, blank jobs: >= 7,000 jobs/s.

Exact command (from the repo root)::

    python bench/embedded_throughput.py --jobs 100000 --entities 10000 \
        --shards 8 --threads 4

Each row runs in its own child process (a fresh temp SQLite file, a fresh structlog
configuration, its own peak RSS):

* ``raw``: the broker alone, one thread: ``send_batch`` of 10 blank messages spread
  over the shard queues, then ``receive`` (10, no wait) + ``delete_batch`` until every
  queue is empty. The ceiling the node works against.
* ``node-b1-warn`` / ``node-b10-warn``: a worker whose ``perform`` does nothing
  (``batch_size`` 1 and 10), logging at level warning to /dev/null as the CLI would
  with ``--log-level warning``; ``publish_many`` the jobs, then
  ``app.node(app.plan(threads=T), until_empty=True).run()`` in-process.
* ``node-b1-info`` / ``node-b10-info``: the same at level info (the default: one
  JSON log event per job), to /dev/null.

Processed jobs/s is counted from ``Node.run()`` start to its return (which includes
the until-empty drain detection, about 0.5-1 s) and, separately, to the end of the
last ``perform`` (timestamped inside ``perform``). ``--rows`` picks rows.
To profile a row, run it alone under py-spy, e.g.
``py-spy record -o prof.svg -- python bench/embedded_throughput.py --row node-b1-warn``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from _common import git_head, machine, peak_rss_mib, table

ROWS = {
    "raw": dict(kind="raw"),
    "node-b1-warn": dict(kind="node", batch_size=1, level="warning"),
    "node-b10-warn": dict(kind="node", batch_size=10, level="warning"),
    "node-b1-info": dict(kind="node", batch_size=1, level="info"),
    "node-b10-info": dict(kind="node", batch_size=10, level="info"),
}
GOAL = 7000.0


def run_raw(args: argparse.Namespace, path: str) -> dict:
    from shardq.broker import SqliteBroker
    from shardq.broker.base import SendEntry

    broker = SqliteBroker(path)
    queues = [f"raw-{s}.fifo" for s in range(args.shards)]
    for q in queues:
        broker.ensure_queue(q, visibility_timeout=60)
    body = json.dumps(
        {
            "v": 1,
            "worker": "Blank",
            "entity": "e0",
            "payload": {},
            "published_at": time.time(),
            "meta": {},
        },
        separators=(",", ":"),
    )
    t0 = time.perf_counter()
    sent = 0
    for b in range(args.jobs // 10):
        entries = [
            SendEntry(str(i), body, f"e{(b * 10 + i) % args.entities}", f"d{b}-{i}")
            for i in range(10)
        ]
        sent += len(broker.send_batch(queues[b % len(queues)], entries).message_ids)
    send_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = receives = 0
    for q in queues:
        while True:
            msgs = broker.receive(q, max_messages=10, wait_seconds=0, visibility_timeout=60)
            receives += 1
            if not msgs:
                break
            broker.delete_batch(q, [m.receipt for m in msgs])
            done += len(msgs)
    recv_s = time.perf_counter() - t0
    broker.close()
    return dict(sent=sent, send_s=send_s, processed=done, process_s=recv_s, receives=receives)


def run_node(args: argparse.Namespace, spec: dict, path: str) -> dict:
    import shardq
    import shardq.ops.logs
    from shardq.broker import SqliteBroker

    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    shardq.ops.logs.configure(fmt="json", level=spec["level"], stream=devnull)

    app = shardq.App(shardq.Config(threads=args.threads), broker=SqliteBroker(path))
    state = {"count": 0, "first": None, "last": 0.0}
    lock = threading.Lock()

    class Blank(shardq.Worker):
        shards = args.shards
        batch_size = spec["batch_size"]

        def perform(self, entity_id: str, payloads: list) -> None:
            now = time.perf_counter()
            with lock:
                state["count"] += len(payloads)
                state["last"] = now
                if state["first"] is None:
                    state["first"] = now

    app.register(Blank)
    app.ensure_queues()
    jobs = [(f"entity-{i % args.entities}", {}) for i in range(args.jobs)]
    t0 = time.perf_counter()
    report = Blank.publish_many(jobs)
    publish_s = time.perf_counter() - t0
    assert report.sent == args.jobs, report.sent

    node = app.node(app.plan(threads=args.threads), until_empty=True, seed=1)
    t0 = time.perf_counter()
    code = node.run()
    run_s = time.perf_counter() - t0
    tally = node.tally()
    app.broker.close()
    return dict(
        sent=report.sent,
        publish_s=publish_s,
        processed=state["count"],
        succeeded=sum(tally.succeeded.values()),
        run_s=run_s,
        busy_s=state["last"] - t0 if state["count"] else float("nan"),
        first_s=state["first"] - t0 if state["first"] else float("nan"),
        exit_code=code,
    )


def child(args: argparse.Namespace) -> None:
    spec = ROWS[args.row]
    with tempfile.TemporaryDirectory(prefix="shardq-bench-") as tmp:
        path = os.path.join(tmp, "broker.db")
        result = run_raw(args, path) if spec["kind"] == "raw" else run_node(args, spec, path)
        result["db_mib"] = (
            sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)) / 2**20
        )
    result["rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per row (default 100000)")
    parser.add_argument("--entities", type=int, default=10_000, help="distinct entity ids")
    parser.add_argument("--shards", type=int, default=8, help="shards of the worker")
    parser.add_argument("--threads", type=int, default=4, help="node threads (lanes)")
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"comma-separated rows to run (default all: {','.join(ROWS)})",
    )
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row here
    args = parser.parse_args()
    if args.row:
        child(args)
        return

    print(f"shardq embedded throughput  git {git_head()}")
    print(f"machine: {machine()}")
    print(
        f"jobs={args.jobs} entities={args.entities} shards={args.shards} threads={args.threads}\n",
        flush=True,
    )
    rows = []
    for name in args.rows.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--row",
            name,
            "--jobs",
            str(args.jobs),
            "--entities",
            str(args.entities),
            "--shards",
            str(args.shards),
            "--threads",
            str(args.threads),
        ]
        load = os.getloadavg()[0]
        out = subprocess.run(cmd, capture_output=True, text=True)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode or not line:
            print(f"row {name} failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")
            continue
        r = json.loads(line[-1][len("RESULT ") :])
        if ROWS[name]["kind"] == "raw":
            pub = r["sent"] / r["send_s"]
            proc = r["processed"] / r["process_s"]
            rows.append(
                [
                    name,
                    f"{pub:,.0f}",
                    f"{proc:,.0f}",
                    "-",
                    "-",
                    f"{r['rss_mib']:.0f}",
                    f"{load:.2f}",
                    "-",
                ]
            )
        else:
            pub = r["sent"] / r["publish_s"]
            proc = r["processed"] / r["run_s"]
            busy = r["processed"] / r["busy_s"]
            ok = "yes" if proc >= GOAL else "NO"
            rows.append(
                [
                    name,
                    f"{pub:,.0f}",
                    f"{proc:,.0f}",
                    f"{busy:,.0f}",
                    f"{r['run_s']:.1f}/{r['busy_s']:.1f}",
                    f"{r['rss_mib']:.0f}",
                    f"{load:.2f}",
                    ok,
                ]
            )
            if r["processed"] != args.jobs or r["succeeded"] != args.jobs:
                print(
                    f"  warning: {name} processed {r['processed']} / succeeded "
                    f"{r['succeeded']} of {args.jobs}"
                )
        print(f"  {name}: {json.dumps(r)}", flush=True)
    print()
    print(
        table(
            [
                "row",
                "publish jobs/s",
                "processed jobs/s",
                "to last perform",
                "run/busy s",
                "peak RSS MiB",
                "load",
                f">= {GOAL:,.0f}?",
            ],
            rows,
        )
    )
    print(
        "\nraw: publish = send_batch msgs/s; processed = receive+delete_batch msgs/s "
        "(one thread, no node)"
    )
    print(f"machine after: {machine()}")


if __name__ == "__main__":
    main()
