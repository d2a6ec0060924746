"""A long run of one node at a steady rate: does its memory, threads or files grow?

Exact command (from the repo root)::

    python bench/soak.py --seconds 1800 --rate 300

One ``shardq run`` process (embedded broker, 4 threads, log level warning) serves the
8 shards of ``bench/_soak_app.Soak`` while this process publishes ``--rate`` jobs a
second with ``publish_many``, in batches of 100, for ``--seconds``. Every entity gets 3
jobs and is never used again, so anything the node keeps per entity (or per message)
grows with time; 10 % of jobs fail once and are retried, 1 % (``--dead-every``) always
fail and go to the morgue. Every ``--every`` seconds the node's resident memory (VmRSS), threads and
open files are read from /proc, with the jobs still queued and the embedded file's
size. After the publishing it waits until the queues are empty and stops the node
with SIGTERM (it must exit 0).

The slope of the node's memory is the least-squares line through the samples after
``--warmup`` seconds, in MiB per hour; a leak of a few hundred bytes per job shows as
tens of MiB per hour at 300 jobs/s.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, git_head, machine, table

from shardq import App, Worker
from shardq.core.config import Config
from shardq.morgue import Morgue

BENCH = Path(__file__).resolve().parent
BATCH = 100


def proc(pid: int) -> tuple[float, int, int]:
    """(resident MiB, threads, open files) of process ``pid``."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss = int(status["VmRSS"].split()[0]) / 1024
    return rss, int(status["Threads"]), len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 3600 * sum((t - mx) * (v - my) for t, v in points) / var if var else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=300, help="jobs published per second")
    parser.add_argument("--every", type=float, default=10, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--dead-every", type=int, default=100, help="1 job in N dies (0: none)")
    args = parser.parse_args()
    print(f"# {machine()} head={git_head()}")
    sys.path.insert(0, str(BENCH))
    from _soak_app import Soak, app

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "soak.db"
        url = f"sqlite:///{db}"
        app.configure(Config(broker_url=url))
        app.ensure_queues()
        queues = [app.shard_queue("Soak", s) for s in range(Soak.shards)]
        log = open(Path(tmp) / "node.log", "wb")  # noqa: SIM115 - closed below
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardq",
                "run",
                "--app",
                "_soak_app",
                "--broker-url",
                url,
                "--threads",
                str(args.threads),
                "--log-level",
                "warning",
            ],
            cwd=BENCH,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            rows, points, published = run(args, node.pid, Soak, app, queues, db)
            node.send_signal(signal.SIGTERM)
            code = node.wait(60)
        finally:
            if node.poll() is None:
                node.kill()
                node.wait()
            log.close()
        events = (Path(tmp) / "node.log").read_text(errors="replace").splitlines()
        unexpected = [e for e in events if e.startswith("{") and "job.morgued" not in e]
        print(f"node log: {len(events)} lines, {len(unexpected)} not job.morgued")
        print("\n".join(unexpected[:10]))
        dead = Morgue(app, "Soak").size(exact=True)
        with sqlite3.connect(db) as conn:  # what the file holds, by table and index
            sizes = conn.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 5"
            ).fetchall()
            items = conn.execute(
                "SELECT substr(key, 1, instr(key, '/')), COUNT(*), SUM(length(value)) "
                "FROM shardq_state GROUP BY 1"
            ).fetchall()
        print("largest:", ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in sizes))
        print("state items:", ", ".join(f"{n} {c} ({b / 2**20:.1f} MiB)" for n, c, b in items))
        print(table(["s", "published", "queued", "RSS MiB", "threads", "fds", "file MiB"], rows))
        late = [(t, v) for t, v in points if t >= args.warmup]
        first, last = late[0][1] if late else float("nan"), points[-1][1]
        print(
            f"published {published} jobs in {args.seconds:.0f} s; {dead} in the morgue "
            f"(expected: {published // args.dead_every if args.dead_every else 0}); "
            f"node exit code {code}\n"
            f"RSS after {args.warmup:.0f} s warm-up {first:.1f} MiB, at the end {last:.1f} MiB, "
            f"max {max(v for _, v in points):.1f} MiB; slope {slope_per_hour(late):+.2f} MiB/h"
        )


def run(
    args: argparse.Namespace, pid: int, worker: type[Worker], app: App, queues: list[str], db: Path
) -> tuple[list[list[str]], list[tuple[float, float]], int]:
    broker = app.broker
    start = time.monotonic()
    published, next_sample = 0, 0.0
    rows: list[list[str]] = []
    points: list[tuple[float, float]] = []
    draining = False
    while True:
        now = time.monotonic() - start
        if not draining and now < args.seconds:
            due = int(now * args.rate)
            while published + BATCH <= due:
                jobs = []
                for i in range(published, published + BATCH):
                    dead = args.dead_every and i % args.dead_every == 7
                    payload = {"n": i, "retry": i % 10 == 3, "dead": bool(dead)}
                    jobs.append((f"e{i // 3}", payload))
                worker.publish_many(jobs)
                published += BATCH
        else:
            draining = True
        if now >= next_sample or draining:
            counts = [broker.counts(q) for q in queues]
            queued = sum(c.waiting + c.in_flight for c in counts)
            rss, threads, fds = proc(pid)
            size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*")) / 2**20
            points.append((now, rss))
            rows.append(
                [
                    f"{now:.0f}",
                    str(published),
                    str(queued),
                    f"{rss:.1f}",
                    str(threads),
                    str(fds),
                    f"{size:.1f}",
                ]
            )
            next_sample = now + args.every
            if draining and queued == 0:
                return rows, points, published
            if draining:
                time.sleep(args.every)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
