"""Resharding a live worker, large: what a reshard costs in time, pauses and requests.

The driver is ``tests/chaos.py`` with reshards (``tests/chaos_reshard.py``); the CI
test ``tests/test_reshard.py`` runs a small version. Elastic ``shardq run`` nodes
serve the ledger app while a publisher process sends numbered jobs (10 % of attempts
failing); ``shardq reshard`` runs at the given times, a busy node is SIGKILLed during
each (unless ``--no-kill``) and a new one joins. Then the ledger is checked as in
every chaos run, and per reshard this prints:

* **time**: from the move's start to its end (the layout document's ``started`` and
  the retired generation's ``ended``);
* **pauses**: for each pair of consecutive jobs of an entity, the time from when the
  later one was ready (published, and the earlier one done) to its first success;
  the longest (and p99) of those overlapping the reshard, against those outside
  every reshard;
* **requests** (``--broker sqs`` only): the nodes and the publisher reach ministack
  through the counting proxy (``bench/peers/proxy.py``, per-queue counts sampled
  every second; the driver bypasses it). Requests during the move, by queue (the
  layout queue, each generation's shard queues, the rest), against an equally long
  window just before the first reshard; and those of the retire period (from the
  move's end until its queues were deleted).

Exact commands (from the repo root)::

    python bench/reshard.py --broker sqlite
    python bench/reshard.py --broker sqs

(defaults: 3 nodes, 200 entities x 100 jobs, reshards 8 -> 16 at 90 s and -> 5 at
240 s, trust 60 s, layout refresh 10 s, lease 10 s, 420 s of publishing.) Exit status
0 when the checker found nothing wrong. Results go to RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _common import git_head, machine


class Sampler(threading.Thread):
    """Request counts of the proxy by queue and action, read every second."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/__proxy/queues"
        self.samples: list[tuple[float, Counter[str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as resp:
                    counts: dict[str, int] = json.loads(resp.read())
            except OSError:
                continue
            by_key: Counter[str] = Counter()
            for key, n in counts.items():  # "<queue> <action>[:detail][:vt=N]"
                queue, _, action = key.partition(" ")
                by_key[f"{queue} {action.split(':vt=')[0]}"] += n
            self.samples.append((time.time(), by_key))

    def at(self, t: float) -> Counter[str]:
        """The counts of the last sample at or before ``t``."""
        found: Counter[str] = Counter()
        for when, counts in self.samples:
            if when > t:
                break
            found = counts
        return found

    def between(self, lo: float, hi: float) -> Counter[str]:
        after, before = self.at(hi), self.at(lo)
        return Counter({q: after[q] - before[q] for q in after if after[q] - before[q]})


def kind_of(queue: str, prefix: str) -> str:
    """A queue's part in a reshard: layout, gen N (shard queues), or other."""
    name = queue.rsplit("/", 1)[-1]
    if not name.startswith(prefix):
        return "other"
    rest = name[len(prefix) :]
    if rest.startswith("shardq-layout"):
        return "layout"
    if m := re.fullmatch(r"ledgered-g(\d+)-\d+\.fifo", rest, re.IGNORECASE):
        return f"gen {m.group(1)}"
    if re.fullmatch(r"ledgered-\d+\.fifo", rest, re.IGNORECASE):
        return "gen 0"
    return "other"


def by_kind(counts: Counter[str], prefix: str) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for key, n in counts.items():
        kinds[kind_of(key.split(" ", 1)[0], prefix)] += n
    return dict(sorted(kinds.items()))


def by_action(counts: Counter[str], prefix: str, kinds: set[str]) -> dict[str, int]:
    """Requests to queues of ``kinds`` by action."""
    actions: Counter[str] = Counter()
    for key, n in counts.items():
        queue, _, action = key.partition(" ")
        if kind_of(queue, prefix) in kinds:
            actions[action] += n
    return dict(actions.most_common())


def main() -> int:
    from tests import chaos, chaos_reshard
    from tests import emulator as emu
    from tests.apps import ledger

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("sqlite", "sqs"), default="sqlite")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--entities", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=100, help="numbered jobs per entity")
    parser.add_argument("--burst", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.005, help="seconds per job")
    parser.add_argument(
        "--reshard",
        action="append",
        metavar="AT:SHARDS",
        help="reshard to SHARDS at AT s into the run (repeat; default 90:16 240:5)",
    )
    parser.add_argument("--duration", type=float, default=460.0, help="seconds of the run")
    parser.add_argument("--publish-share", type=float, default=0.92)
    parser.add_argument("--trust", type=float, default=60.0, help="SHARDQ_RESHARD_TRUST_SECONDS")
    parser.add_argument("--refresh", type=float, default=10.0, help="SHARDQ_LAYOUT_REFRESH_SECONDS")
    parser.add_argument("--lease-seconds", type=int, default=10)
    parser.add_argument("--no-kill", action="store_true", help="no node killed in a reshard")
    parser.add_argument("--kill-command", type=int, action="append", default=[], metavar="I")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="proxy delay (sqs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the logs and the ledger")
    args = parser.parse_args()
    plan = [item.split(":") for item in (args.reshard or ["90:16", "240:5"])]
    settings = chaos.Settings(
        layout="elastic",
        nodes=args.nodes,
        max_nodes=args.nodes + len(plan),
        shards=args.shards,
        entities=args.entities,
        jobs=args.jobs,
        burst=args.burst,
        sleep=args.sleep,
        duration=args.duration,
        publish_share=args.publish_share,
        publisher="process",
        reshards=tuple((float(at), int(n)) for at, n in plan),
        reshard_kill=not args.no_kill,
        kill_reshard_command=tuple(args.kill_command),
        layout_refresh_seconds=args.refresh,
        reshard_trust_seconds=args.trust,
        lease_seconds=args.lease_seconds,
        drain_timeout=600.0,
        seed=args.seed,
    )
    work = Path(tempfile.mkdtemp(prefix="shardq-reshard-"))
    print(f"# {machine()}  git={git_head()}")
    print(f"# {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}")
    print(f"# settings: {settings}")
    print(f"# logs and ledger: {work}")
    prefix = f"rs{uuid.uuid4().hex[:6]}-"
    env = {"SHARDQ_QUEUE_PREFIX": prefix}
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"  [{time.monotonic() - started:6.1f} s] {line}", flush=True)

    sampler: Sampler | None = None
    if args.broker == "sqlite":
        env["SHARDQ_BROKER_URL"] = f"sqlite:///{work / 'broker.db'}"
        report = chaos.run(settings, env, work, say=say)
    else:
        from _sides import emulator_behind_proxy

        server = emu.start()
        try:
            with emulator_behind_proxy(args.latency_ms, str(work), server.endpoint_url) as up:
                env.update(
                    SHARDQ_BROKER_URL="sqs://",
                    SHARDQ_ENDPOINT_URL=up.endpoint,
                    SHARDQ_REGION="us-east-1",
                )
                sampler = Sampler(up.port)
                sampler.start()
                direct = {"SHARDQ_ENDPOINT_URL": server.endpoint_url}
                report = chaos.run(settings, env, work, say=say, driver_env=direct)
                time.sleep(1.5)
                sampler.stop.set()
                sampler.join()
        finally:
            emu.stop(server)
    print(report.summary())
    if not report.ok:
        print(report.details())
    entries = ledger.read(str(work / "ledger.jsonl"))
    confirmed = _confirmed(work / "published.jsonl")
    windows = [(r.began, r.began + (r.seconds or 0.0)) for r in report.reshards]
    inside, outside = chaos_reshard.pauses(entries, confirmed, windows)
    print(f"pauses outside the reshards: {outside.text()}")
    for r, found in zip(report.reshards, inside, strict=True):
        print(
            f"reshard {r.from_shards} -> {r.to_shards}: {r.seconds or -1:.1f} s; pauses: "
            f"{found.text()}"
        )
    if sampler is not None:
        _requests(sampler, report.reshards, prefix, _deleted_at(work))
    with open(work / "report.json", "w") as out:
        chaos.write_json(report, out)
    if not args.keep and report.ok:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()
    else:
        print(f"# kept: {work}")
    return 0 if report.ok else 1


def _confirmed(path: Path) -> dict[tuple[str, int], float]:
    found: dict[tuple[str, int], float] = {}
    for line in path.read_text().splitlines():
        item = json.loads(line)
        for entity, n in item.get("jobs", []):
            found[(entity, n)] = item["t"]
    return found


def _deleted_at(work: Path) -> dict[int, float]:
    """Per old generation, when the nodes' logs say its last queue was deleted."""
    last: dict[int, float] = {}
    for path in work.glob("node*.log"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("event") != "layout.queue_deleted":
                continue
            m = re.search(r"-g(\d+)-\d+\.fifo$", str(event.get("queue")), re.IGNORECASE)
            gen = int(m.group(1)) if m else 0
            when = _stamp(str(event.get("timestamp")))
            last[gen] = max(last.get(gen, 0.0), when)
    return last


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _requests(
    sampler: Sampler, reshards: list[Any], prefix: str, deleted: dict[int, float]
) -> None:
    if not reshards or not sampler.samples:
        return
    first = reshards[0].began
    lo = max(sampler.samples[0][0], first - 80.0)  # steady: up to 80 s before any reshard
    base = sampler.between(lo, first)
    rate = sum(base.values()) / max(1e-9, first - lo)
    print(
        f"requests before the first reshard ({first - lo:.0f} s): {rate:.1f}/s; by queue: "
        f"{by_kind(base, prefix)}; shard queues by action: "
        f"{by_action(base, prefix, {'gen 0'})}"
    )
    for r in reshards:
        length = r.seconds or 0.0
        during = sampler.between(r.began, r.began + length)
        _window(f"reshard {r.from_shards} -> {r.to_shards}, the move", during, length, rate, prefix)
        gone = deleted.get(r.from_gen)
        if gone is not None:
            after = sampler.between(r.began + length, gone)
            _window(
                "  retire period (until its last queue was deleted)",
                after,
                gone - r.began - length,
                rate,
                prefix,
            )


def _window(what: str, counts: Counter[str], length: float, rate: float, prefix: str) -> None:
    total = sum(counts.values())
    kinds = by_kind(counts, prefix)
    shard_kinds = {k for k in kinds if k.startswith("gen ")}
    print(
        f"requests, {what} ({length:.0f} s): {total} ({total / max(1e-9, length):.1f}/s), "
        f"{total - rate * length:+.0f} against the rate before; by queue: {kinds}; "
        f"shard queues by action: {by_action(counts, prefix, shard_kinds)}"
    )


if __name__ == "__main__":
    sys.exit(main())
