"""Idle pickup latency and idle SQS cost of one node with 64 shards, on ministack.

Goal: a job published to any of 64 idle shards of a node
starts within 1 s (p99), while the node makes <= 180 SQS requests per idle shard
per hour.

Exact command (from the repo root)::

    python bench/idle_pickup.py --jobs 100 --threads 4 --window 60

Starts ministack with ``tests/emulator.py`` on 127.0.0.1 (stopped by its pid at the
end, also on Ctrl-C), sets AWS_ACCESS_KEY_ID/SECRET=test and region us-east-1. An App
on ``SqsBroker(region="us-east-1", endpoint_url=...)`` has one worker with
``shards=64`` (batch_size 1); a Node with ``--threads`` threads and the default
``idle_wait_seconds`` (20) runs in-process in a thread.

0. Warm-up: one job to each of the 64 shards (so every queue's size limit is cached
   by the publisher, as in a long-running publisher), then ``--settle`` seconds.
1. Pickup latency: ``--jobs`` jobs published one at a time (``Worker.publish``) to
   random entities (so random shards) at random intervals of 0.05-0.5 s; each
   payload carries ``time.time()`` taken just before the publish call, and
   ``perform`` records ``time.time()`` minus it. Reports p50/p95/p99/max.
2. Idle cost: with no jobs, ``SqsBroker.requests`` is counted over ``--window``
   seconds: requests per idle shard per hour = requests / 64 / window * 3600.

Then ``node.stop()`` (the node returns once its pollers' long polls end, up to 20 s)
and the emulator is stopped by pid. ``--endpoint-url URL`` uses a running emulator.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
import uuid
from collections import Counter

from _common import git_head, machine, peak_rss_mib, percentile, with_emulator

SHARDS = 64
GOAL_P99_S = 1.0
GOAL_PER_SHARD_HOUR = 180.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs for the pickup latency")
    parser.add_argument("--threads", type=int, default=4, help="node threads")
    parser.add_argument("--window", type=float, default=60.0, help="idle window in seconds")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to let startup settle")
    parser.add_argument("--min-gap", type=float, default=0.05, help="shortest gap between jobs")
    parser.add_argument("--max-gap", type=float, default=0.5, help="longest gap between jobs")
    parser.add_argument("--seed", type=int, default=1, help="random seed for entities and gaps")
    parser.add_argument("--endpoint-url", help="use this running emulator instead of starting one")
    args = parser.parse_args()

    with_emulator(args.endpoint_url, lambda endpoint: run(args, endpoint))


def run(args: argparse.Namespace, endpoint: str) -> None:
    import shardq
    import shardq.ops.logs
    from shardq.broker.sqs import SqsBroker
    from shardq.core.topology import shard_for

    shardq.ops.logs.configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    broker = SqsBroker(region="us-east-1", endpoint_url=endpoint)
    config = shardq.Config(threads=args.threads, queue_prefix=f"i{uuid.uuid4().hex[:6]}-")
    app = shardq.App(config, broker=broker)
    latencies: list[float] = []
    done = threading.Condition()
    seen = {"jobs": 0}

    class Idle(shardq.Worker):
        shards = SHARDS

        def perform(self, entity_id: str, payloads: list) -> None:
            now = time.time()
            with done:
                for p in payloads:
                    if "t" in p:
                        latencies.append(now - p["t"])
                    seen["jobs"] += 1
                done.notify_all()

    app.register(Idle)
    rng = random.Random(args.seed)
    print(f"shardq idle pickup  git {git_head()}")
    print(f"machine: {machine()}")
    print(
        f"shards={SHARDS} threads={args.threads} idle_wait_seconds={config.idle_wait_seconds} "
        f"jobs={args.jobs} gaps={args.min_gap}-{args.max_gap} s window={args.window} s",
        flush=True,
    )

    app.ensure_queues()
    node = app.node(app.plan(threads=args.threads), seed=args.seed)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(node.run()), name="bench-node")
    thread.start()
    try:
        # 0. warm-up: one job per shard, then let startup settle
        warm = {}
        i = 0
        while len(warm) < SHARDS:
            entity = f"warm-{i}"
            warm.setdefault(shard_for(entity, SHARDS), entity)
            i += 1
        for entity in warm.values():
            Idle.publish(entity, {"warm": True})
        wait_for(done, seen, SHARDS, 60)
        time.sleep(args.settle)

        # 1. pickup latency
        before = Counter(broker.requests)
        t0 = time.monotonic()
        for n in range(args.jobs):
            time.sleep(rng.uniform(args.min_gap, args.max_gap))
            Idle.publish(f"entity-{rng.randrange(1_000_000)}", {"t": time.time(), "n": n})
        wait_for(done, seen, SHARDS + args.jobs, 60)
        pickup_s = time.monotonic() - t0
        pickup_reqs = Counter(broker.requests) - before
        with done:
            lat = list(latencies)

        # 2. idle cost
        time.sleep(2.0)  # let the last jobs' deletes finish
        before = Counter(broker.requests)
        t0 = time.monotonic()
        time.sleep(args.window)
        window = time.monotonic() - t0
        idle_reqs = Counter(broker.requests) - before
        load = os.getloadavg()
    finally:
        node.stop()
        thread.join(60)

    total = sum(idle_reqs.values())
    per_shard_hour = total / SHARDS / window * 3600
    print(f"\npickup latency over {len(lat)} jobs (publish call start -> perform start):")
    if lat:
        p50, p95, p99 = (percentile(lat, p) for p in (50, 95, 99))
        print(
            f"  p50 {p50 * 1000:.0f} ms  p95 {p95 * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms  "
            f"max {max(lat) * 1000:.0f} ms  min {min(lat) * 1000:.0f} ms"
        )
        print(f"  p99 <= {GOAL_P99_S:.0f} s: {'MEETS' if p99 <= GOAL_P99_S else 'MISSES'}")
    print(f"  requests during the pickup phase ({pickup_s:.1f} s): {dict(pickup_reqs)}")
    print(f"\nidle cost over {window:.1f} s with no jobs: {total} requests {dict(idle_reqs)}")
    print(
        f"  = {per_shard_hour:.1f} requests per idle shard per hour "
        f"(goal <= {GOAL_PER_SHARD_HOUR:.0f}): "
        f"{'MEETS' if per_shard_hour <= GOAL_PER_SHARD_HOUR else 'MISSES'}"
    )
    if window < 2 * config.idle_wait_seconds:
        print(
            f"  note: a window under 2 x idle_wait_seconds ({config.idle_wait_seconds:.0f} s)"
            " sees few or no poll ends; use a multiple of it (60 s or more)"
        )
    print(f"  load during the window (1/5/15 min): {' '.join(f'{x:.2f}' for x in load)}")
    print(
        f"\nnode exit code {codes[0] if codes else 'still running'}; "
        f"peak RSS {peak_rss_mib():.0f} MiB (this process)"
    )
    print(f"machine after: {machine()}", flush=True)


def wait_for(cond: threading.Condition, seen: dict, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with cond:
        while seen["jobs"] < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"only {seen['jobs']} of {n} jobs ran within {timeout} s")
            cond.wait(left)


if __name__ == "__main__":
    main()
