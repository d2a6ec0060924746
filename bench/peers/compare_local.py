"""shardq's embedded SQLite broker against huey (SQLite storage) and RQ (Redis) on one
machine, in one run: jobs/s and CPU per job for blank jobs.

Exact command (from the repo root, in the peers' virtualenv made by
``bench/peers/setup.sh``; Redis from Debian's ``redis-server`` package)::

    /tmp/peers-venv/bin/python bench/peers/compare_local.py --jobs 20000 --concurrency 4

What it does, per system (``local_drivers.py`` has the configuration of each):

1. a fresh SQLite file (shardq, huey) or an emptied Redis (``FLUSHALL``; rq);
2. publishes ``--jobs`` blank jobs with the system's own publisher in a child process,
   before any worker runs (timed: publish jobs/s);
3. starts the worker with ``--concurrency`` threads (shardq, huey) or processes (rq),
   waits until it has imported everything, reads its process tree's CPU time, says
   "go", waits until every job has a success line, waits ``--settle`` s, reads the CPU
   time again and stops the worker tree by pid.

jobs/s = jobs / (last success - go). Worker CPU per job = CPU (user + sys, children
included) of the worker's process tree over the run, over jobs; the 10-90 % figure
leaves out start-up and the tail. shardq and huey keep their queue inside the worker
process (SQLite), so their worker CPU includes the broker's work; RQ's queue lives
in redis-server, whose CPU is shown in its own column and added in "total".

Redis is started here, bound to 127.0.0.1 on a free port with its own directory and
its defaults otherwise (``redis-server`` without a config file), and stopped by its
pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _peers import (
    HERE,
    RECORDS_ENV,
    git_head,
    loadavg1,
    machine,
    make_jobs,
    measure_worker,
    order_report,
    stop_pids,
    table,
    versions,
)

DRIVER = str(HERE / "local_drivers.py")
PACKAGES = ("huey", "rq", "redis", "structlog", "psutil")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(tmp: str) -> tuple[subprocess.Popen, int, str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: apt-get install -y redis-server")
    port = free_port()
    rdir = os.path.join(tmp, "redis")
    os.makedirs(rdir)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    log = open(os.path.join(tmp, "redis.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", rdir, "--daemonize", "no"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port, version
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_pids(proc)
                raise RuntimeError(f"redis-server did not start; see {log.name}") from None
            time.sleep(0.05)


def flush_redis(port: int) -> None:
    from redis import Redis

    Redis(host="127.0.0.1", port=port).flushall()


def run_one(args: argparse.Namespace, system: str, ctx: dict) -> dict:
    tag = system
    records = os.path.join(ctx["tmp"], f"{tag}.records")
    ready = os.path.join(ctx["tmp"], f"{tag}.ready")
    common = ["--system", system, "--concurrency", str(args.concurrency)]
    common += ["--shards", str(args.shards), "--jobs", str(args.jobs)]
    common += ["--entities", str(args.entities)]
    side = {}
    if system.startswith("rq"):
        flush_redis(ctx["redis_port"])
        common += ["--redis-port", str(ctx["redis_port"])]
        side["redis"] = ctx["redis_pid"]
    else:
        common += ["--path", os.path.join(ctx["tmp"], f"{tag}.db")]
    env = dict(os.environ, **{RECORDS_ENV: records})
    res: dict = {"system": system, "load1_start": loadavg1()}
    pub = subprocess.run(
        [sys.executable, DRIVER, "publish", *common],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(HERE),
        timeout=900,
    )
    if pub.returncode != 0:
        res["error"] = f"publish failed: {pub.stderr.strip()[-800:]}"
        return res
    res["publish_s"] = json.loads(pub.stdout.strip().splitlines()[-1])["publish_s"]
    out = measure_worker(
        [sys.executable, DRIVER, "work", *common, "--ready-file", ready],
        env=env,
        ready=ready,
        records=records,
        jobs=args.jobs,
        log_path=os.path.join(ctx["tmp"], f"{tag}.log"),
        timeout=args.timeout,
        settle=args.settle,
        side_pids=side,
    )
    lines = out.pop("lines", [])
    res.update(out)
    res["order"] = vars(order_report(lines, ctx["jobs"]))
    return res


def summarise(results: list[dict], jobs: int) -> str:
    rows = []
    for r in results:
        if "cpu_ms_per_job" not in r:
            rows.append([r["system"], "ERROR", "", "", "", "", "", "", f"{r['load1_start']:.2f}"])
            continue
        redis = r.get("redis_cpu_ms_per_job", 0.0)
        rows.append(
            [
                r["system"],
                f"{jobs / r['publish_s']:,.0f}",
                f"{r.get('jobs_per_s', float('nan')):,.0f}",
                f"{r['cpu_ms_per_job']:.3f}",
                f"{r.get('steady_cpu_ms_per_job', float('nan')):.3f}",
                f"{redis:.3f}" if "redis_cpu_ms_per_job" in r else "-",
                f"{r['cpu_ms_per_job'] + redis:.3f}",
                f"{r['order']['entities_out_of_order']}/{r['order']['entities']}",
                f"{r['load1_go']:.2f}",
            ]
        )
    return table(
        [
            "system",
            "publish jobs/s",
            "jobs/s",
            "worker CPU ms/job",
            "10-90 %",
            "redis-server ms/job",
            "total ms/job",
            "entities out of order",
            "load1",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4, help="threads or processes")
    parser.add_argument("--shards", type=int, default=8, help="shardq shards")
    parser.add_argument("--settle", type=float, default=0.5, help="s after the last job")
    parser.add_argument("--timeout", type=float, default=600.0, help="s per system")
    parser.add_argument("--systems", default="shardq,huey,rq-simple,rq")
    parser.add_argument("--json-out", help="write every figure as JSON here")
    args = parser.parse_args()
    systems = args.systems.split(",")

    print(f"peers on one machine  shardq git {git_head()}")
    print(f"machine: {machine()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions(PACKAGES).items()))
    tmp = tempfile.mkdtemp(prefix="peers-local-")
    redis = None
    results: list[dict] = []
    try:
        ctx: dict = {"tmp": tmp, "jobs": make_jobs(args.jobs, args.entities)}
        if any(s.startswith("rq") for s in systems):
            redis, ctx["redis_port"], rversion = start_redis(tmp)
            ctx["redis_pid"] = redis.pid
            print(f"{rversion}; pid {redis.pid} port {ctx['redis_port']}")
        print(
            f"jobs={args.jobs} entities={args.entities} concurrency={args.concurrency} "
            f"shardq shards={args.shards}; logs in {tmp}",
            flush=True,
        )
        for system in systems:
            r = run_one(args, system, ctx)
            results.append(r)
            short = {k: r.get(k) for k in ("jobs_per_s", "cpu_ms_per_job", "done", "error")}
            print(f"  {system:10s} {short}", flush=True)
    finally:
        if redis is not None:
            stop_pids(redis, grace=5.0, second_term=False)
            print(f"redis-server pid {redis.pid} stopped", flush=True)
    print()
    print(summarise(results, args.jobs))
    for r in results:
        if "error" in r:
            print(f"{r['system']}: ERROR {r['error']}")
    print(f"machine after: {machine()}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
        print(f"figures written to {args.json_out}")


if __name__ == "__main__":
    main()
