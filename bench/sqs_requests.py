"""SQS requests per 1,000 jobs published (publish_many) and processed, on ministack.

Goal: <= 320 SQS requests per 1,000 jobs published with
``publish_many`` and processed (the floor is 300: 100 SendMessageBatch + 100
ReceiveMessage + 100 DeleteMessageBatch with every batch full).

Exact command (from the repo root)::

    python bench/sqs_requests.py --jobs 1000 --entities 100 --shards 4 \
        --threads 4

Starts ministack with ``tests/emulator.py`` on 127.0.0.1 (stopped by its pid at the
end, also on Ctrl-C), sets AWS_ACCESS_KEY_ID/SECRET=test and region us-east-1, and
uses an App on ``SqsBroker(region="us-east-1", endpoint_url=...)`` with a blank
worker (``perform`` does nothing; ``--batch-size``). Requests come from
``SqsBroker.requests`` (a Counter per operation, counted by the broker for every
request botocore sends), snapshotted per phase:

* setup: ``app.ensure_queues()`` before publishing (per queue a GetQueueUrl, and a
  CreateQueue for one that is missing);
* publish: ``publish_many`` of the jobs;
* process: ``Node(app, plan, until_empty=True).run()`` until it returns.

ReceiveMessage calls that returned no message are counted separately (this script
wraps the broker's ``receive``) as "idle" receives. Requests are also
grouped by role: messages (Send/Receive-with-messages/Delete), idle receives,
visibility changes, and setup/metadata (CreateQueue, GetQueueUrl,
GetQueueAttributes).

``--endpoint-url URL`` uses an already running emulator instead of starting one.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections import Counter

from _common import git_head, machine, peak_rss_mib, with_emulator

GOAL, FLOOR = 320, 300
META = ("CreateQueue", "GetQueueUrl", "GetQueueAttributes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to publish (default 1000)")
    parser.add_argument("--entities", type=int, default=100, help="distinct entity ids")
    parser.add_argument("--shards", type=int, default=4, help="shards of the worker")
    parser.add_argument("--threads", type=int, default=4, help="node threads")
    parser.add_argument("--batch-size", type=int, default=1, help="worker batch_size")
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=20.0,
        help="config idle_wait_seconds (default 20, as shipped)",
    )
    parser.add_argument("--endpoint-url", help="use this running emulator instead of starting one")
    args = parser.parse_args()

    with_emulator(args.endpoint_url, lambda endpoint: run(args, endpoint))


def run(args: argparse.Namespace, endpoint: str) -> None:
    import shardq
    import shardq.ops.logs
    from shardq.broker.sqs import SqsBroker

    shardq.ops.logs.configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    broker = SqsBroker(region="us-east-1", endpoint_url=endpoint)
    receives = Counter()  # "with" / "empty" ReceiveMessage calls
    rlock = threading.Lock()

    real_receive = broker.receive

    def receive(queue: str, **kwargs: float) -> list:
        messages = real_receive(queue, **kwargs)  # type: ignore[arg-type]
        with rlock:
            receives["with" if messages else "empty"] += 1
        return messages

    broker.receive = receive  # type: ignore[method-assign]

    prefix = f"b{uuid.uuid4().hex[:6]}-"
    config = shardq.Config(
        threads=args.threads, queue_prefix=prefix, idle_wait_seconds=args.idle_wait
    )
    app = shardq.App(config, broker=broker)
    state = {"count": 0, "last": 0.0}
    lock = threading.Lock()

    class Blank(shardq.Worker):
        shards = args.shards
        batch_size = args.batch_size

        def perform(self, entity_id: str, payloads: list) -> None:
            with lock:
                state["count"] += len(payloads)
                state["last"] = time.perf_counter()

    app.register(Blank)

    def snap() -> tuple[Counter, Counter]:
        with rlock:
            return Counter(broker.requests), Counter(receives)

    print(f"shardq SQS requests  git {git_head()}")
    print(f"machine: {machine()}")
    print(
        f"jobs={args.jobs} entities={args.entities} shards={args.shards} "
        f"threads={args.threads} batch_size={args.batch_size} idle_wait={args.idle_wait}",
        flush=True,
    )

    s0 = snap()
    t0 = time.perf_counter()
    app.ensure_queues()
    setup_s = time.perf_counter() - t0
    s1 = snap()
    jobs = [(f"entity-{i % args.entities}", {"i": i}) for i in range(args.jobs)]
    t0 = time.perf_counter()
    report = Blank.publish_many(jobs)
    publish_s = time.perf_counter() - t0
    s2 = snap()
    assert report.sent == args.jobs

    node = app.node(app.plan(threads=args.threads), until_empty=True, seed=1)
    t0 = time.perf_counter()
    code = node.run()
    run_s = time.perf_counter() - t0
    busy_s = state["last"] - t0
    s3 = snap()
    succeeded = sum(node.tally().succeeded.values())

    phases = {"setup": diff(s0, s1), "publish": diff(s1, s2), "process": diff(s2, s3)}
    per = 1000.0 / args.jobs
    print("\nrequests by phase and operation (absolute, then per 1,000 jobs):")
    ops = sorted({op for reqs, _ in phases.values() for op in reqs})
    for name, (reqs, recv) in phases.items():
        parts = ", ".join(f"{op} {reqs[op]}" for op in ops if reqs[op])
        extra = (
            f"  [ReceiveMessage: {recv['with']} with messages, {recv['empty']} empty]"
            if reqs["ReceiveMessage"]
            else ""
        )
        print(
            f"  {name:8s} total {sum(reqs.values()):5d} ({sum(reqs.values()) * per:6.1f}/1k): "
            f"{parts}{extra}"
        )

    total = Counter()
    empty = 0
    for name in ("publish", "process"):
        total += phases[name][0]
        empty += phases[name][1]["empty"]
    setup_total = sum(phases["setup"][0].values())
    roles = {
        "messages (Send + Receive-with-messages + Delete)": total["SendMessageBatch"]
        + total["ReceiveMessage"]
        - empty
        + total["DeleteMessageBatch"],
        "idle receives (ReceiveMessage returning nothing)": empty,
        "visibility changes (ChangeMessageVisibilityBatch)": total["ChangeMessageVisibilityBatch"],
        "metadata (GetQueueAttributes, GetQueueUrl, CreateQueue)": sum(total[o] for o in META),
    }
    other = sum(total.values()) - sum(roles.values())
    print("\npublish + process, by role (per 1,000 jobs):")
    for role, n in roles.items():
        print(f"  {role:58s} {n * per:7.1f}")
    if other:
        print(f"  {'other':58s} {other * per:7.1f}")
    pp = sum(total.values()) * per
    steady = pp - sum(total[o] for o in META) * per
    print(
        f"\nSQS requests per 1,000 jobs, publish + process:          {pp:7.1f}  "
        f"(goal <= {GOAL}, floor {FLOOR}): {'MEETS' if pp <= GOAL else 'MISSES'}"
    )
    print(f"  ... without metadata calls (GetQueueAttributes etc.):  {steady:7.1f}")
    print(
        f"  ... with one-time setup ({setup_total} GetQueueUrl/CreateQueue):   "
        f"{pp + setup_total * per:7.1f}"
    )
    print(f"\nprocessed {state['count']} (succeeded {succeeded}), exit code {code}")
    print(
        f"setup {setup_s:.2f} s; publish {publish_s:.2f} s ({args.jobs / publish_s:,.0f} jobs/s); "
        f"node run {run_s:.2f} s ({state['count'] / run_s:,.0f} jobs/s), to last perform "
        f"{busy_s:.2f} s ({state['count'] / busy_s:,.0f} jobs/s) on the emulator"
    )
    print(f"peak RSS {peak_rss_mib():.0f} MiB (this process; the emulator is separate)")
    print(f"machine after: {machine()}")
    sys.stdout.flush()


def diff(a: tuple[Counter, Counter], b: tuple[Counter, Counter]) -> tuple[Counter, Counter]:
    return b[0] - a[0], b[1] - a[1]


if __name__ == "__main__":
    main()
