"""How long ``shardq run`` takes to exit on SQS: after SIGTERM when idle, and after its
last job with ``--until-empty``; base vs current checkout in one run.

Exact command (from the repo root)::

    python bench/shutdown_times.py --repeats 3 --latency-ms 20 --idle-wait 20

Starts ministack (``tests/emulator.py``) behind the counting proxy adding
``--latency-ms`` per request (``bench/peers/proxy.py``), all on 127.0.0.1 and stopped
by pid at the end. The base is ``git archive 197a6ab shardq`` in a temporary
directory (``--base-rev``/``--base PATH``), the current side this checkout
(``--current PATH``). Every node is a real ``python -m shardq run --config FILE``
child process with ``PYTHONPATH=<checkout>:bench`` (``bench/_sides.py``), a config
file (``sqs://`` at the proxy, a fresh queue prefix, ``idle_wait_seconds``
``--idle-wait``, 20 as shipped, ``--threads``, app ``lane_worker:ledger_app`` with
``--shards`` shards, log format and level left at their defaults: JSON at info on
stderr, kept in a temp file), the way the tests start node processes.

For each of ``--repeats`` repeats, sides alternating (base first in odd repeats,
current first in even ones):

* ``idle``: start ``shardq run``, wait for its first log line and ``--settle`` s more
  (every shard long-polling an empty queue), send SIGTERM, and time until the
  process has exited (``wait``); its exit code. A node still alive 120 s after
  SIGTERM is killed and counted as a timeout.
* ``until-empty``: publish ``--jobs`` ledger jobs (no failures) from a child on the
  same side, then run ``shardq run --until-empty``; time from the last job's success
  (the ``time.time()`` the worker wrote to its ledger) to the process exit; its exit
  code and the jobs that never succeeded.

Prints every measurement, then per side and case the median and max seconds and the
exit codes, and the ratio current/base of the medians. Nothing is written to the
repository; ``--keep`` keeps the temp directory (node logs, configs, ledgers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import yaml
from _common import machine, table
from _sides import (
    Side,
    Upstream,
    add_side_args,
    check_ledger,
    command_line,
    emulator_behind_proxy,
    in_turn,
    median,
    origin,
    ratio,
    read_ledger,
    run_child,
    sides,
    stop_pid,
)

CASES = ("idle", "until-empty")
EXIT_TIMEOUT = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurements per case (3)")
    parser.add_argument("--jobs", type=int, default=200, help="until-empty jobs (200)")
    parser.add_argument("--entities", type=int, default=20, help="until-empty entities (20)")
    parser.add_argument("--shards", type=int, default=4, help="shards of the worker (4)")
    parser.add_argument("--threads", type=int, default=4, help="node threads (4)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added per request (20)")
    parser.add_argument("--idle-wait", type=float, default=20.0, help="idle_wait_seconds (20)")
    parser.add_argument("--settle", type=float, default=3.0, help="idle time before SIGTERM (3)")
    parser.add_argument("--endpoint-url", help="a running emulator instead of starting one")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, ledgers)")
    add_side_args(parser, base_by_default=True)
    args = parser.parse_args()
    if min(args.repeats, args.jobs, args.entities, args.shards, args.threads) < 1:
        parser.error("--repeats, --jobs, --entities, --shards and --threads must be >= 1")

    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(
        f"repeats={args.repeats} jobs={args.jobs} entities={args.entities} shards={args.shards} "
        f"threads={args.threads} latency={args.latency_ms:g} ms idle_wait={args.idle_wait:g} "
        f"settle={args.settle:g}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="shutdown-times-")
    try:
        with (
            sides(args) as pair,
            emulator_behind_proxy(args.latency_ms, tmp, args.endpoint_url) as up,
        ):
            for side in pair:
                print(f"{side.name}: {side.label}; `shardq run` imports {origin(side, tmp)}")
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {
                (case, side.name): [] for case in CASES for side in pair
            }
            for rep in range(args.repeats):
                for case in CASES:
                    for side in in_turn(pair, rep):
                        work = os.path.join(tmp, f"{case}-{side.name}-{rep}")
                        os.mkdir(work)
                        measure = idle if case == "idle" else until_empty
                        res = measure(args, side, up, work)
                        runs[(case, side.name)].append(res)
                        print(f"  repeat {rep + 1} {case:11s} {side.name:7s}: {describe(res)}")
        print(f"\nseconds to exit, over {args.repeats} repeat(s)")
        print(summary(runs, [s.name for s in pair]))
        print(f"\nmachine after: {machine()}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def write_config(args: argparse.Namespace, up: Upstream, work: str) -> str:
    path = os.path.join(work, "shardq.yaml")
    config = {
        "broker_url": "sqs://",
        "region": "us-east-1",
        "endpoint_url": up.endpoint,
        "queue_prefix": f"s{uuid.uuid4().hex[:6]}-",
        "app": "lane_worker:ledger_app",
        "threads": args.threads,
        "idle_wait_seconds": args.idle_wait,
        "workers": {"Ledger": {"shards": args.shards}},
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def ensure(side: Side, config: str, work: str) -> None:
    """``shardq queues ensure``: the queues and, on versions that keep one, the state
    table a node needs before it starts (exit 4, settings drifted, is fine here)."""
    proc = subprocess.run(
        [sys.executable, "-m", "shardq", "queues", "ensure", "--config", config],
        cwd=work,
        env=side.env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 4):
        raise RuntimeError(f"{side.name}: queues ensure exited {proc.returncode}: {proc.stderr}")


def start_node(side: Side, config: str, work: str, *flags: str) -> subprocess.Popen[bytes]:
    env = side.env(LANE_LEDGER=os.path.join(work, "ledger"), LANE_FAIL_PERCENT="0")
    with open(os.path.join(work, "node.log"), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "shardq", "run", "--config", config, *flags],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def wait_exit(proc: subprocess.Popen[bytes]) -> tuple[float, int | str]:
    """Wait for ``proc`` (killed after EXIT_TIMEOUT); the time.time() it was seen gone."""
    try:
        code: int | str = proc.wait(EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        code = "timeout"
    return time.time(), code


def idle(args: argparse.Namespace, side: Side, up: Upstream, work: str) -> dict[str, Any]:
    config = write_config(args, up, work)
    ensure(side, config, work)
    log = os.path.join(work, "node.log")
    proc = start_node(side, config, work)
    try:
        deadline = time.monotonic() + 60
        while os.path.getsize(log) == 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{side.name} node did not start; see {log}")
            time.sleep(0.05)
        time.sleep(args.settle)
        if proc.poll() is not None:
            raise RuntimeError(f"{side.name} node exited {proc.returncode} while idle; see {log}")
        sent = time.time()
        os.kill(proc.pid, signal.SIGTERM)
        gone, code = wait_exit(proc)
    finally:
        stop_pid(proc)
    return {"seconds": gone - sent, "code": code}


def until_empty(args: argparse.Namespace, side: Side, up: Upstream, work: str) -> dict[str, Any]:
    config = write_config(args, up, work)
    ensure(side, config, work)
    spec = {"cmd": "publish", "config": config, "jobs": args.jobs, "entities": args.entities}
    published = run_child(side, spec, os.path.join(work, "publish.log"))["published"]
    proc = start_node(side, config, work, "--until-empty")
    try:
        gone, code = wait_exit(proc)
    finally:
        stop_pid(proc)
    entries = read_ledger(os.path.join(work, "ledger"))
    last = max((t for _, _, t in entries), default=float("nan"))
    lost = check_ledger(entries, args.entities, args.jobs)["lost"]
    return {"seconds": gone - last, "code": code, "lost": lost, "published": published}


def describe(res: dict[str, Any]) -> str:
    text = f"{res['seconds']:.2f} s, exit {res['code']}"
    if "lost" in res:
        text += f", published {res['published']}, never succeeded {res['lost']}"
    return text


def summary(runs: dict[tuple[str, str], list[dict[str, Any]]], names: list[str]) -> str:
    headers = ["case", "side", "median s", "max s", "exit codes", "never succeeded"]
    rows = []
    for case in CASES:
        med = {}
        for name in names:
            secs = [r["seconds"] for r in runs[(case, name)]]
            med[name] = median(secs)
            lost = [str(r["lost"]) for r in runs[(case, name)] if "lost" in r]
            rows.append(
                [
                    case,
                    name,
                    f"{med[name]:.2f}",
                    f"{max(secs):.2f}",
                    ",".join(str(r["code"]) for r in runs[(case, name)]),
                    ",".join(lost) or "-",
                ]
            )
        if "base" in med:
            rows.append([case, "current/base", ratio(med["current"], med["base"]), "", "", ""])
    return table(headers, rows)


if __name__ == "__main__":
    main()
