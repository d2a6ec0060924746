"""Where a node's CPU goes on SQS: the ``blank`` run of ``lane_latency.py`` under py-spy.

Runs one side's child (``bench/_side_child.py``, scenario ``blank``) under
``py-spy record`` (``pip install py-spy``; not a dependency of shardq) against
ministack behind the latency proxy, keeps only the samples taken while the node ran
(stacks under ``run_node`` in the main thread, and every sample of the node's own
threads: lanes, I/O and settle pools, leases, pollers), and prints the share of
samples per area (botocore's pipeline by stage, urllib3/http.client, shardq by
module, thread hand-offs) and the top functions by own and by total samples.

Exact command (from the repo root)::

    python bench/sqs_profile.py --jobs 5000 --entities 100 --shards 4 --threads 4 \\
        --latency-ms 20

py-spy samples only threads that are running (not waiting in a syscall), so the
shares approximate CPU. ``--gil`` keeps only samples of the thread holding the GIL.
``--raw FILE`` keeps py-spy's raw output. ``--current PATH`` profiles another
checkout.

``--by-thread`` runs without py-spy and prints instead the node's CPU per job split by
thread (the kernel's count for each thread, ``/proc/self/task/*/schedstat``, summed
per kind: lanes, I/O pool (receives), settle pool (deletes, visibility changes), lease
keeper, pollers, the node's own thread), over ``--rounds`` runs::

    python bench/sqs_profile.py --by-thread --jobs 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _common import machine
from _sides import CHILD, Side, command_line, describe, emulator_behind_proxy, run_child

#: Areas, by the first frame (innermost first) whose file matches; order matters.
AREAS = [
    ("botocore: signing", ("botocore/auth.py", "botocore/signers.py")),
    ("botocore: parsing", ("botocore/parsers.py",)),
    ("botocore: serializing", ("botocore/serialize.py", "botocore/validate.py")),
    ("botocore: endpoint rules", ("botocore/regions.py", "botocore/endpoint_provider.py")),
    ("botocore: events/hooks", ("botocore/hooks.py", "botocore/handlers.py")),
    ("botocore: retries", ("botocore/retries/", "botocore/retryhandler.py")),
    ("botocore: user agent", ("botocore/useragent.py",)),
    ("http (urllib3, http.client, socket)", ("urllib3/", "http/client.py", "socket.py")),
    ("botocore: other", ("botocore/",)),
    ("json", ("json/",)),
    ("threads (queue, threading, futures)", ("queue.py", "threading.py", "concurrent/")),
    ("shardq", ("shardq/",)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    parser.add_argument("--top", type=int, default=25, help="functions listed (25)")
    parser.add_argument("--raw", help="keep py-spy's raw output here")
    parser.add_argument("--current", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--endpoint-url", help="a running emulator instead of starting one")
    parser.add_argument("--by-thread", action="store_true", help="CPU per thread, no py-spy")
    parser.add_argument("--rounds", type=int, default=1, help="runs with --by-thread (1)")
    args = parser.parse_args()
    if args.by_thread:
        by_thread(args)
        return
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(pyspy).exists():
        sys.exit("py-spy not found: pip install py-spy")
    path = Path(args.current).resolve()
    side = Side("current", path, describe(path))
    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(f"side: {side.label}", flush=True)
    tmp = tempfile.mkdtemp(prefix="sqs-profile-")
    raw = args.raw or f"{tmp}/raw.txt"
    try:
        with emulator_behind_proxy(args.latency_ms, tmp, args.endpoint_url) as up:
            spec = spec_for(args, up)
            cmd = [pyspy, "record", "-r", str(args.rate), "-f", "raw", "-o", raw, "--threads"]
            if args.gil:
                cmd.append("--gil")
            cmd += ["--", sys.executable, str(CHILD), json.dumps(spec)]
            with open(f"{tmp}/child.log", "w") as log:
                out = subprocess.run(
                    cmd,
                    env=side.env(),
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    check=False,
                    cwd=tmp,
                )
        result = next(
            (json.loads(x[7:]) for x in out.stdout.splitlines() if x.startswith("RESULT ")), None
        )
        if result is None:
            sys.exit(f"the child gave no result; see {tmp}/child.log")
        cpu_ms = result["cpu_s"] * 1000 / args.jobs
        print(f"node: {result['processed']} jobs, CPU {cpu_ms:.3f} ms/job (under py-spy)")
        report(read_samples(raw), args.top)
    finally:
        if args.raw is None:
            shutil.rmtree(tmp, ignore_errors=True)


def spec_for(args: argparse.Namespace, up: Any) -> dict[str, Any]:
    return {
        "cmd": "sqs",
        "scenario": "blank",
        "endpoint": up.endpoint,
        "port": up.port,
        "prefix": f"p{uuid.uuid4().hex[:6]}-",
        "jobs": args.jobs,
        "entities": args.entities,
        "shards": args.shards,
        "threads": args.threads,
        "idle_wait": 20.0,
        "log_level": "warning",
    }


def by_thread(args: argparse.Namespace) -> None:
    path = Path(args.current).resolve()
    side = Side("current", path, describe(path))
    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(f"side: {side.label}", flush=True)
    tmp = tempfile.mkdtemp(prefix="sqs-threads-")
    try:
        with emulator_behind_proxy(args.latency_ms, tmp, args.endpoint_url) as up:
            for rnd in range(args.rounds):
                spec = {**spec_for(args, up), "thread_cpu": True}
                res = run_child(side, spec, f"{tmp}/child-{rnd}.log")
                per = {k: 1000 * v / args.jobs for k, v in res["thread_cpu_s"].items()}
                ranked = sorted(per.items(), key=lambda kv: -kv[1])
                parts = ", ".join(f"{k} {v:.3f}" for k, v in ranked)
                print(
                    f"  run {rnd + 1}: CPU {1000 * res['cpu_s'] / args.jobs:.3f} ms/job "
                    f"(threads {sum(per.values()):.3f}): {parts}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_samples(raw: str) -> Counter[tuple[str, ...]]:
    """Stacks (outermost first, frames ``func (file:line)``) of the node's run, counted."""
    stacks: Counter[tuple[str, ...]] = Counter()
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = tuple(stack.split(";"))
            if len(frames) < 2:
                continue  # no Python frame (start-up, exit)
            main_thread = frames[1].startswith("<module> (_side_child.py")
            if main_thread and not any(fr.startswith("run_node ") for fr in frames):
                continue  # imports, queue creation, publishing: not the node's run
            if any(fr.startswith("_find_and_load ") for fr in frames):
                continue  # an import (once per process)
            stacks[frames[1:]] += int(n)
    return stacks


def _file(frame: str) -> str:
    return frame.rpartition("(")[2].rstrip(")")


def area(frames: tuple[str, ...]) -> str:
    for frame in reversed(frames):
        where = _file(frame)
        for name, marks in AREAS:
            if any(m in where for m in marks):
                if name == "shardq":
                    return "shardq: " + where.rpartition("shardq/")[2].partition(":")[0]
                return name
    return "other"


def report(stacks: Counter[tuple[str, ...]], top: int) -> None:
    total = sum(stacks.values())
    if not total:
        print("no samples of the node's run")
        return
    areas: Counter[str] = Counter()
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    for frames, n in stacks.items():
        areas[area(frames)] += n
        if frames:
            own[_short(frames[-1])] += n
        for name in {_short(f) for f in frames}:
            cumulative[name] += n
    print(f"\n{total} samples of the node's run; share by area (innermost frame that matches):")
    for name, n in areas.most_common():
        print(f"  {100 * n / total:5.1f} %  {name}")
    print(f"\ntop {top} by own samples:")
    for name, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f} %  {name}")
    print(f"\ntop {top} by total samples:")
    for name, n in cumulative.most_common(top):
        print(f"  {100 * n / total:5.1f} %  {name}")


def _short(frame: str) -> str:
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0]
    for mark in ("site-packages/", "lib/python3", "/shardq/"):
        if mark in path:
            path = path.rpartition(mark)[2]
            break
    return f"{func} ({path})"


if __name__ == "__main__":
    main()
