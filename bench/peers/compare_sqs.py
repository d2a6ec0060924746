"""shardq against Celery (kombu SQS), sqs-workers and dramatiq (dramatiq-sqs) on one
ministack SQS emulator, in one run: jobs/s, worker CPU per job, SQS requests per 1,000
jobs, and per-entity order violations with and without injected failures.

Exact command (from the repo root, in the peers' virtualenv made by
``bench/peers/setup.sh``)::

    /tmp/peers-venv/bin/python bench/peers/compare_sqs.py --jobs 2000 --entities 100 \
        --concurrency 4 --fail-rate 0.1

What it does:

* starts ministack on 127.0.0.1 (``tests/emulator.py``) and the counting proxy
  (``bench/peers/proxy.py``) in front of it; every client's endpoint is the proxy;
* for each system and each mode (``clean``: no failures; ``fail``: ``--fail-rate`` of
  attempts raise), with fresh queues (a new prefix per run):

  1. publishes ``--jobs`` jobs over ``--entities`` entities (seeded random entity
     order, sequence numbers per entity) with the system's own publisher, in a child
     process, before any worker runs;
  2. starts the worker (``sqs_drivers.py work``), waits until it has imported and
     configured everything, reads the CPU time of its process tree, then says "go";
  3. waits until every job has a success line in the records file, waits
     ``--settle`` s more (late deletes and acks), reads the CPU time and the proxy's
     counts again, and stops the worker tree by pid;

* jobs/s = jobs / (last success - go); worker CPU per job = CPU of the worker's process
  tree (user + sys, children included) between "go" and the end of the settle time,
  over jobs (that includes the worker's start-up after "go": connections, pool
  forks); requests per 1,000 jobs from the proxy (publish and process phases; queue
  creation and look-ups included);
* order: each entity's success lines must come in sequence order; the table gives
  the entities with any success of a lower sequence number after a higher one.

The emulator's and the proxy's CPU is shown per run but not counted as worker CPU.
Ministack and the proxy are stopped by pid at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from _peers import (
    FAIL_ENV,
    HERE,
    RECORDS_ENV,
    count_diff,
    git_head,
    loadavg1,
    machine,
    make_jobs,
    measure_worker,
    order_report,
    proxy_counts,
    sqs_requests,
    stop_pids,
    table,
    versions,
)

DRIVER = str(HERE / "sqs_drivers.py")
META = {
    "CreateQueue",
    "GetQueueUrl",
    "GetQueueAttributes",
    "ListQueues",
    "SetQueueAttributes",
    "TagQueue",
}
PACKAGES = (
    "celery",
    "kombu",
    "pycurl",
    "sqs-workers",
    "dramatiq",
    "dramatiq-sqs",
    "boto3",
    "botocore",
    "ministack",
    "structlog",
    "psutil",
)


def start_proxy(upstream: str, log_dir: str, verbose: bool) -> tuple[subprocess.Popen, int]:
    log = open(os.path.join(log_dir, "proxy.err"), "w")  # noqa: SIM115
    extra = ["--log", os.path.join(log_dir, "proxy.log")] if verbose else []
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "proxy.py"), "--upstream", upstream, *extra],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("PROXY "):
        stop_pids(proc)
        raise RuntimeError(f"proxy did not start: {line!r}")
    return proc, int(line.split()[1])


def run_one(args, system: str, mode: str, ctx: dict) -> dict:
    n = args.jobs
    tag = f"{system}-{mode}"
    ctx["seq"] += 1  # a fresh prefix, so no run ever sees another run's queue
    prefix = f"r{ctx['run']}n{ctx['seq']}-"
    records = os.path.join(ctx["tmp"], f"{tag}.records")
    ready = os.path.join(ctx["tmp"], f"{tag}.ready")
    common = [
        "--system",
        system,
        "--endpoint",
        ctx["endpoint"],
        "--prefix",
        prefix,
        "--concurrency",
        str(args.concurrency),
        "--shards",
        str(args.shards),
    ]
    env = dict(os.environ, **{RECORDS_ENV: records, FAIL_ENV: str(ctx["fail"][mode])})
    res: dict = {"system": system, "mode": mode, "load1_start": loadavg1()}

    ents = str(args.entities)
    c0 = proxy_counts(ctx["port"])
    pub = subprocess.run(
        [sys.executable, DRIVER, "publish", *common, "--jobs", str(n), "--entities", ents],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    c1 = proxy_counts(ctx["port"])
    if pub.returncode != 0:
        res["error"] = f"publish failed: {pub.stdout.strip()[-300:]} {pub.stderr.strip()[-600:]}"
        return res
    res["publish_s"] = json.loads(pub.stdout.strip().splitlines()[-1])["publish_s"]
    res["publish_requests"] = count_diff(c0, c1)

    marks: dict[str, dict[str, int]] = {}
    out = measure_worker(
        [sys.executable, DRIVER, "work", *common, "--ready-file", ready],
        env=env,
        ready=ready,
        records=records,
        jobs=n,
        log_path=os.path.join(ctx["tmp"], f"{tag}.log"),
        timeout=args.timeout,
        settle=args.settle,
        side_pids={"emulator": ctx["emulator_pid"], "proxy": ctx["proxy_pid"]},
        at_go=lambda: marks.__setitem__("go", proxy_counts(ctx["port"])),
        at_end=lambda: marks.__setitem__("end", proxy_counts(ctx["port"])),
    )
    lines = out.pop("lines", [])
    res.update(out)
    if "go" in marks and "end" in marks:
        res["process_requests"] = count_diff(marks["go"], marks["end"])
        res["order"] = vars(order_report(lines, ctx["jobs"]))
    return res


def per_k(counts: dict[str, int], jobs: int) -> float:
    return sqs_requests(counts) * 1000.0 / jobs


def summarise(results: list[dict], jobs: int) -> str:
    rows = []
    for r in results:
        if "process_requests" not in r:
            rows.append(
                [r["system"], r["mode"], "ERROR", "", "", "", "", "", "", f"{r['load1_start']:.2f}"]
            )
            continue
        o = r["order"]
        pk, qk = per_k(r["publish_requests"], jobs), per_k(r["process_requests"], jobs)
        rows.append(
            [
                r["system"],
                r["mode"],
                f"{r.get('jobs_per_s', float('nan')):,.0f}",
                f"{r['cpu_ms_per_job']:.2f} / {r.get('steady_cpu_ms_per_job', float('nan')):.2f}",
                f"{pk:.0f} + {qk:.0f} = {pk + qk:.0f}",
                f"{o['entities_out_of_order']}/{o['entities']}",
                f"{o['duplicates']}",
                f"{o['missing']}",
                f"{r['emulator_cpu_ms_per_job']:.2f}",
                f"{r['load1_go']:.2f}",
            ]
        )
    return table(
        [
            "system",
            "mode",
            "jobs/s",
            "worker CPU ms/job (all / 10-90 %)",
            "requests/1k (publish + process)",
            "entities out of order",
            "dup runs",
            "lost",
            "emulator ms/job",
            "load1",
        ],
        rows,
    )


def breakdown(results: list[dict], jobs: int) -> str:
    lines = []
    for r in results:
        if "process_requests" not in r:
            continue
        lines.append(f"{r['system']} / {r['mode']}:")
        for phase in ("publish_requests", "process_requests"):
            c = r[phase]
            parts = ", ".join(
                f"{k} {v * 1000 / jobs:.1f}"
                for k, v in sorted(c.items(), key=lambda kv: -kv[1])
                if ":" not in k
            )
            recv = ""
            if "ReceiveMessage" in c:
                recv = (
                    f"  [receives with messages {c.get('ReceiveMessage:with-messages', 0)}, "
                    f"empty {c.get('ReceiveMessage:empty', 0)}]"
                )
            lines.append(f"  {phase.split('_')[0]:8s} per 1k: {parts}{recv}")
        extra = [f"first success {r.get('first_s', float('nan')):.2f} s after go"]
        extra.append(f"injected failures {r.get('injected_failures', 0)}")
        extra.append(f"proxy {r['proxy_cpu_ms_per_job']:.2f} ms/job")
        if r["order"]["examples"]:
            extra.append("e.g. " + "; ".join(r["order"]["examples"]))
        if "error" in r:
            extra.append("ERROR " + r["error"])
        lines.append("  " + "; ".join(extra))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4, help="threads or processes")
    parser.add_argument("--shards", type=int, default=4, help="shardq shards (FIFO queues)")
    parser.add_argument("--fail-rate", type=float, default=0.1)
    parser.add_argument("--settle", type=float, default=1.0, help="s after the last job")
    parser.add_argument("--timeout", type=float, default=300.0, help="s per run")
    parser.add_argument("--systems", default="shardq,celery,celery-threads,sqs-workers,dramatiq")
    parser.add_argument("--modes", default="clean,fail")
    parser.add_argument(
        "--proxy-log", action="store_true", help="proxy logs every request (debugging)"
    )
    parser.add_argument("--json-out", help="write every figure as JSON here")
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    from tests import emulator as emu

    print(f"peers on SQS (ministack)  shardq git {git_head()}")
    print(f"machine: {machine()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions(PACKAGES).items()))
    print(
        f"jobs={args.jobs} entities={args.entities} concurrency={args.concurrency} "
        f"shardq shards={args.shards} fail rate={args.fail_rate} settle={args.settle}s",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="peers-sqs-")
    server = emu.start()
    proxy = None
    results: list[dict] = []
    try:
        proxy, port = start_proxy(server.endpoint_url, tmp, args.proxy_log)
        print(
            f"ministack pid {server.pid} port {server.port}; proxy pid {proxy.pid} port {port}; "
            f"logs in {tmp}",
            flush=True,
        )
        ctx = {
            "tmp": tmp,
            "run": uuid.uuid4().hex[:4],
            "seq": 0,
            "endpoint": f"http://127.0.0.1:{port}",
            "port": port,
            "emulator_pid": server.pid,
            "proxy_pid": proxy.pid,
            "jobs": make_jobs(args.jobs, args.entities),
            "fail": {"clean": 0.0, "fail": args.fail_rate},
        }
        for system in args.systems.split(","):
            for mode in args.modes.split(","):
                r = run_one(args, system, mode, ctx)
                results.append(r)
                short = {k: r.get(k) for k in ("jobs_per_s", "cpu_ms_per_job", "done", "error")}
                print(f"  {system:15s} {mode:5s} {short}", flush=True)
    finally:
        if proxy is not None:
            stop_pids(proxy, grace=2.0)
        emu.stop(server)
        print(f"proxy and ministack (pid {server.pid}) stopped", flush=True)

    print()
    print(summarise(results, args.jobs))
    print()
    print(breakdown(results, args.jobs))
    by = {(r["system"], r["mode"]): r for r in results}
    s = by.get(("shardq", "clean"))
    for peer in ("celery", "celery-threads"):
        c = by.get((peer, "clean"))
        if not (s and c and "cpu_ms_per_job" in s and "cpu_ms_per_job" in c):
            continue
        ratio = s["cpu_ms_per_job"] / c["cpu_ms_per_job"]
        steady = s.get("steady_cpu_ms_per_job", float("nan")) / c.get(
            "steady_cpu_ms_per_job", float("nan")
        )
        print(
            f"shardq worker CPU per job / {peer}'s (clean run): {ratio:.2f} whole run, "
            f"{steady:.2f} at 10-90 % (goal <= 0.33): {'MEETS' if ratio <= 1 / 3 else 'MISSES'}"
        )
    print(f"machine after: {machine()}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
        print(f"figures written to {args.json_out}")
    with contextlib.suppress(OSError):
        sys.stdout.flush()


if __name__ == "__main__":
    main()
