"""A node's lane on SQS with an in-region round trip: base vs current checkout, one run.

Compares two checkouts of shardq side by side and reports ratios (current / base),
not absolute times, so the machine's noise is shared: each side runs in its own child
process with ``PYTHONPATH=<checkout>:bench`` (``bench/_sides.py``), the sides
alternate per scenario for ``--rounds`` rounds (base then current in odd rounds,
current then base in even ones, so going first or second weighs the same on both:
keep rounds even), and both talk to the same ministack (``tests/emulator.py``)
through the counting proxy ``bench/peers/proxy.py --latency-ms 20`` (every request
held 20 ms before it is forwarded: about an SQS round trip within a region). All on
127.0.0.1; ministack and the proxy are stopped by pid at the end.

Exact command (from the repo root; the base is ``git archive 197a6ab shardq`` in a
temporary directory, the current side this checkout)::

    python bench/lane_latency.py --jobs 5000 --entities 100 --shards 4 --threads 4 \\
        --rounds 2 --latency-ms 20

``--current PATH`` measures another checkout (e.g. a worktree holding a rewrite of
the node) against the base; ``--base PATH`` / ``--base-rev REV`` pick the base.

Scenarios (``--scenarios``, both by default), workers in ``bench/lane_worker.py``:

* ``blank``: ``--jobs`` blank jobs (``perform`` does nothing) over ``--entities``
  entities (job i: ``entity-{i % entities}``), one worker with ``--shards`` shards.
* ``failing``: the same jobs on the ``Ledger`` worker: ``--fail-percent`` (10) of the
  attempts fail (deterministically: crc32 of entity, job and try), each retried after
  1 s (``retry_in``), ``max_retries`` 1,000 so none reaches the morgue. Successes go to
  a ledger file; after the run it is checked for entities whose first successes are
  out of publish order, lost jobs (never succeeded) and duplicate successes.

Each child: configures the app (``sqs://`` at the proxy, a fresh queue prefix,
``threads``, ``idle_wait_seconds`` ``--idle-wait`` (20 as shipped), logs as JSON at
``--log-level`` (warning) to its stderr, kept in a temp file), creates the queues,
``publish_many`` the jobs (not timed), then times ``app.node(app.plan(threads=T),
until_empty=True).run()``. Figures per run:

* jobs/s: jobs / time from ``run()`` start to the end of the last successful
  ``perform`` (the lane's throughput; ``wall`` below adds the until-empty detection
  and the shutdown);
* CPU ms/job: user + sys of the child (``getrusage(RUSAGE_SELF)``, all its threads)
  around ``run()`` only, divided by the jobs;
* req/1k: SQS requests per 1,000 jobs counted by the proxy, publish + process
  (``publish`` part shown too); idle/1k: ReceiveMessage calls that returned nothing;
* wall: seconds from ``run()`` start to its return; exit: its return value.

Tables show the median over rounds per side and the ratio current/base (for jobs/s
above 1 is better, for CPU per job below 1 is better); failing-scenario errors are
summed over rounds. Two runs of identical code at ``--jobs 500`` differed by up to
20 % in CPU per job (a fixed cost per run, spread over few jobs, on a shared machine):
judge CPU ratios at the full size. ``wall`` at 197a6ab includes up to
``idle_wait_seconds`` of shutdown (pollers finish their long poll), see
``bench/shutdown_times.py``. Nothing is written to the repository; ``--keep`` keeps the
temporary directory (child logs, ledgers) and prints its path.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import uuid
from typing import Any

from _common import machine, table
from _sides import (
    Side,
    add_side_args,
    check_ledger,
    command_line,
    emulator_behind_proxy,
    in_turn,
    median,
    ratio,
    read_ledger,
    run_child,
    sides,
)

SCENARIOS = ("blank", "failing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per run (default 5000)")
    parser.add_argument("--entities", type=int, default=100, help="distinct entities (100)")
    parser.add_argument("--shards", type=int, default=4, help="shards of the worker (4)")
    parser.add_argument("--threads", type=int, default=4, help="node threads (4)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of base, current (2)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added per request (20)")
    parser.add_argument("--fail-percent", type=int, default=10, help="failing attempts (10)")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated: blank,failing"
    )
    parser.add_argument("--idle-wait", type=float, default=20.0, help="idle_wait_seconds (20)")
    parser.add_argument(
        "--log-level", default="warning", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument("--endpoint-url", help="a running emulator instead of starting one")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, ledgers)")
    add_side_args(parser, base_by_default=True)
    args = parser.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown or not scenarios:
        parser.error(f"--scenarios: unknown {unknown}; use some of {', '.join(SCENARIOS)}")
    if min(args.jobs, args.entities, args.shards, args.threads, args.rounds) < 1:
        parser.error("--jobs, --entities, --shards, --threads and --rounds must be >= 1")
    if not 0 <= args.fail_percent < 100:
        parser.error(f"--fail-percent must be from 0 to 99, got {args.fail_percent}")

    print(f"command: {command_line()}")
    print(f"machine: {machine()}")
    print(
        f"jobs={args.jobs} entities={args.entities} shards={args.shards} threads={args.threads} "
        f"rounds={args.rounds} latency={args.latency_ms:g} ms fail={args.fail_percent}% "
        f"idle_wait={args.idle_wait:g} log={args.log_level}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="lane-latency-")
    try:
        with (
            sides(args) as pair,
            emulator_behind_proxy(args.latency_ms, tmp, args.endpoint_url) as up,
        ):
            for side in pair:
                print(f"{side.name}: {side.label}", flush=True)
            runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                s: {side.name: [] for side in pair} for s in scenarios
            }
            for rnd in range(args.rounds):
                for scenario in scenarios:
                    for side in in_turn(pair, rnd):
                        res = run_one(args, side, scenario, rnd, up, tmp)
                        if not any(runs[s][side.name] for s in scenarios):
                            print(f"  {side.name} imports shardq from {res['shardq']}")
                        runs[scenario][side.name].append(res)
                        print(progress_line(side, scenario, rnd, res, args.jobs), flush=True)
        for scenario in scenarios:
            print(f"\nscenario {scenario}: median of {args.rounds} round(s) per side")
            print(summary(runs[scenario], [s.name for s in pair], args.jobs, scenario))
        print(f"\nmachine after: {machine()}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_one(
    args: argparse.Namespace, side: Side, scenario: str, rnd: int, up: Any, tmp: str
) -> dict[str, Any]:
    tag = f"{scenario}-{side.name}-{rnd}"
    ledger = f"{tmp}/ledger-{tag}"
    spec = {
        "cmd": "sqs",
        "scenario": scenario,
        "endpoint": up.endpoint,
        "port": up.port,
        "prefix": f"l{uuid.uuid4().hex[:6]}-",
        "jobs": args.jobs,
        "entities": args.entities,
        "shards": args.shards,
        "threads": args.threads,
        "idle_wait": args.idle_wait,
        "log_level": args.log_level,
    }
    env = {"LANE_LEDGER": ledger, "LANE_FAIL_PERCENT": str(args.fail_percent)}
    res = run_child(side, spec, f"{tmp}/{tag}.log", env=env)
    if scenario == "failing":
        res["ledger"] = check_ledger(read_ledger(ledger), args.entities, args.jobs)
    return res


def requests(res: dict[str, Any]) -> tuple[int, int, int]:
    """(publish + process, publish, idle receives) SQS requests of a run."""

    def real(counts: dict[str, int]) -> int:  # ReceiveMessage:with-messages/:empty are parts
        return sum(n for op, n in counts.items() if ":" not in op)

    pub, proc = res["publish_requests"], res["process_requests"]
    idle = pub.get("ReceiveMessage:empty", 0) + proc.get("ReceiveMessage:empty", 0)
    return real(pub) + real(proc), real(pub), idle


def figures(res: dict[str, Any], jobs: int) -> dict[str, float]:
    total, pub, idle = requests(res)
    per = 1000.0 / jobs
    return {
        "jobs_s": res["processed"] / res["busy_s"] if res["busy_s"] > 0 else 0.0,
        "cpu_ms": res["cpu_s"] * 1000.0 / jobs,
        "busy_cpu_ms": res["busy_cpu_s"] * 1000.0 / jobs,
        "req_1k": total * per,
        "pub_1k": pub * per,
        "idle_1k": idle * per,
        "wall_s": res["run_s"],
    }


def progress_line(side: Side, scenario: str, rnd: int, res: dict[str, Any], jobs: int) -> str:
    f = figures(res, jobs)
    line = (
        f"  round {rnd + 1} {scenario:7s} {side.name:7s}: {f['jobs_s']:7.1f} jobs/s, "
        f"CPU {f['cpu_ms']:.3f} ms/job (busy {f['busy_cpu_ms']:.3f}), "
        f"{f['req_1k']:.1f} req/1k (publish {f['pub_1k']:.1f}, "
        f"idle {f['idle_1k']:.1f}), wall {f['wall_s']:.2f} s, exit {res['code']}, "
        f"processed {res['processed']}/{jobs}"
    )
    if "ledger" in res:
        led = res["ledger"]
        line += (
            f", out of order {led['out_of_order']}, lost {led['lost']}, "
            f"duplicates {led['duplicates']}"
        )
    return line


def summary(runs: dict[str, list[dict[str, Any]]], names: list[str], jobs: int, scen: str) -> str:
    keys = ("jobs_s", "cpu_ms", "busy_cpu_ms", "req_1k", "pub_1k", "idle_1k", "wall_s")
    med = {
        name: {k: median([figures(r, jobs)[k] for r in runs[name]]) for k in keys} for name in names
    }
    headers = [
        "side",
        "jobs/s",
        "CPU ms/job",
        "busy CPU ms/job",
        "req/1k",
        "publish/1k",
        "idle/1k",
        "wall s",
    ]
    if scen == "failing":
        headers += ["out of order", "lost", "duplicates"]
    headers.append("exit codes")
    rows = []
    for name in names:
        m = med[name]
        row = [
            name,
            f"{m['jobs_s']:.1f}",
            f"{m['cpu_ms']:.3f}",
            f"{m['busy_cpu_ms']:.3f}",
            f"{m['req_1k']:.1f}",
            f"{m['pub_1k']:.1f}",
            f"{m['idle_1k']:.1f}",
            f"{m['wall_s']:.2f}",
        ]
        if scen == "failing":
            row += [
                str(sum(r["ledger"][k] for r in runs[name]))
                for k in ("out_of_order", "lost", "duplicates")
            ]
        row.append(",".join(str(r["code"]) for r in runs[name]))
        rows.append(row)
    if "base" in med and "current" in med:
        b, c = med["base"], med["current"]
        row = ["current/base", *(ratio(c[k], b[k]) for k in keys)]
        row += [""] * (len(headers) - len(row))
        rows.append(row)
    out = table(headers, rows)
    if "base" in med and "current" in med:
        out += "\n" + paired(runs, jobs)
    return out


def paired(runs: dict[str, list[dict[str, Any]]], jobs: int) -> str:
    """current/base per round (the two sides of a round ran back to back, so they share
    the machine's state more than runs of different rounds do): median and range."""
    lines = ["per-round ratios current/base, median (min-max):"]
    labels = {"jobs_s": "jobs/s", "cpu_ms": "CPU/job", "busy_cpu_ms": "busy CPU/job"}
    for key, label in labels.items():
        ratios = [
            figures(c, jobs)[key] / figures(b, jobs)[key]
            for b, c in zip(runs["base"], runs["current"], strict=True)
            if figures(b, jobs)[key]
        ]
        if ratios:
            lines.append(
                f"  {label}: {median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                f"over {len(ratios)} rounds: " + " ".join(f"{r:.2f}" for r in ratios)
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
