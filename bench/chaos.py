"""Chaos run, large: node processes SIGKILLed at random while numbered jobs flow.

With ``--layout elastic`` the nodes form an elastic fleet (``shardq run`` without
``--node``) and the events are kills (not restarted), joins and graceful stops;
the report adds the takeover times of a dead node's shards.

The driver is ``tests/chaos.py`` (the CI test ``tests/test_chaos.py`` runs a small
version of it); see its docstring for what a run does and what the checker proves.
Results go to RELIABILITY.md.

Exact commands (from the repo root)::

    python bench/chaos.py --broker sqlite --nodes 4 --entities 1000 --jobs 20 \
        --duration 180 --kill-every 1 3
    python bench/chaos.py --broker sqs --nodes 4 --entities 1000 --jobs 20 \
        --duration 180 --kill-every 1 3
    python bench/chaos.py --broker sqs --nodes 4 --entities 500 --jobs 20 \
        --duration 90 --kill-every 1 3 --outage-at 30 --outage-seconds 10
    python bench/chaos.py --broker sqlite-reopen --nodes 4 --entities 1000 --jobs 20 \
        --duration 180 --kill-every 1 3
    python bench/chaos.py --broker sqlite --layout elastic --nodes 3 --max-nodes 5 \
        --entities 1000 --jobs 20 --duration 240 --event-every 4 10 --publish-share 0.9
    python bench/chaos.py --broker sqs --layout elastic --nodes 3 --max-nodes 5 \
        --entities 1000 --jobs 20 --duration 240 --event-every 4 10 --publish-share 0.9
    python bench/chaos.py --broker sqs --layout elastic --nodes 3 --max-nodes 5 \
        --entities 1000 --jobs 20 --duration 180 --event-every 3 6 --publish-share 0.9

``--broker sqlite`` uses a fresh embedded broker file in a temporary directory;
``--broker sqs`` starts ministack on 127.0.0.1 (with ``PERSIST_STATE=1`` when
``--outage-at`` is given, so that the restarted emulator keeps its queues and
messages), sets AWS_ACCESS_KEY_ID/SECRET=test, and stops it by its pid at the end,
also on failure or Ctrl-C. Exit status 0 when the checker found nothing wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import git_head, machine


def main() -> int:
    from tests import chaos  # importable once _common put the repo root on the path
    from tests import emulator as emu

    defaults = chaos.Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--broker",
        choices=("sqlite", "sqlite-reopen", "sqs"),
        default="sqlite",
        help="sqlite-reopen: the embedded broker with the test-only group reopening defect",
    )
    parser.add_argument("--nodes", type=int, default=4, help="node processes (default 4)")
    parser.add_argument("--layout", choices=chaos.LAYOUTS, default="mixed")
    parser.add_argument("--threads", type=int, default=2, help="threads per node (2)")
    parser.add_argument("--shards", type=int, default=8, help="shards of the worker (8)")
    parser.add_argument("--entities", type=int, default=1000, help="entities (1000)")
    parser.add_argument("--jobs", type=int, default=20, help="numbered jobs per entity (20)")
    parser.add_argument("--burst", type=int, default=defaults.burst)
    parser.add_argument("--fail-rate", type=float, default=defaults.fail_rate)
    parser.add_argument("--permanent", type=float, default=defaults.permanent)
    parser.add_argument("--sleep", type=float, default=0.01, help="seconds per job (0.01)")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of kills")
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=[1.0, 3.0],
        help="seconds between kills, uniform (1 3); 0 0 for no kills",
    )
    parser.add_argument(
        "--event-every",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=list(defaults.event_every),
        help="elastic: seconds between events (kill, join, stop), uniform (3 6)",
    )
    parser.add_argument(
        "--max-nodes", type=int, default=defaults.max_nodes, help="elastic: nodes at most (4)"
    )
    parser.add_argument(
        "--lease-seconds", type=int, default=defaults.lease_seconds, help="elastic: (10)"
    )
    parser.add_argument(
        "--report-seconds", type=int, default=defaults.report_seconds, help="elastic: (5)"
    )
    parser.add_argument("--publish-share", type=float, default=defaults.publish_share)
    parser.add_argument("--visibility-timeout", type=int, default=defaults.visibility_timeout)
    parser.add_argument("--outage-at", type=float, help="stop ministack this many s in")
    parser.add_argument("--outage-seconds", type=float, default=10.0)
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the logs and the ledger")
    args = parser.parse_args()
    if args.outage_at is not None and args.broker != "sqs":
        parser.error("--outage-at needs --broker sqs (the emulator is what goes away)")
    settings = chaos.Settings(
        nodes=args.nodes,
        layout=args.layout,
        threads=args.threads,
        shards=args.shards,
        entities=args.entities,
        jobs=args.jobs,
        burst=args.burst,
        fail_rate=args.fail_rate,
        permanent=args.permanent,
        sleep=args.sleep,
        duration=args.duration,
        kill_every=tuple(args.kill_every) if max(args.kill_every) > 0 else None,  # type: ignore[arg-type]
        publish_share=args.publish_share,
        visibility_timeout=args.visibility_timeout,
        outage_at=args.outage_at,
        outage_seconds=args.outage_seconds,
        drain_timeout=args.drain_timeout,
        seed=args.seed,
        max_nodes=args.max_nodes,
        event_every=tuple(args.event_every),  # type: ignore[arg-type]
        lease_seconds=args.lease_seconds,
        report_seconds=args.report_seconds,
    )
    work = Path(tempfile.mkdtemp(prefix="shardq-chaos-"))
    print(f"# {machine()}  git={git_head()}")
    print(f"# {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}")
    print(f"# settings: {dataclasses.asdict(settings)}")
    print(f"# logs and ledger: {work}")
    env = {"SHARDQ_QUEUE_PREFIX": f"chaos{uuid.uuid4().hex[:6]}-"}
    server = None
    outage = None
    try:
        if args.broker == "sqlite":
            env["SHARDQ_BROKER_URL"] = f"sqlite:///{work / 'broker.db'}"
        elif args.broker == "sqlite-reopen":
            env["SHARDQ_BROKER_URL"] = f"sqlite:///{work / 'broker.db'}?test_reopen_groups=1"
        else:
            os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
            state = str(work / "ministack-state") if args.outage_at is not None else None
            server = emu.start(state_dir=state)
            env.update(
                SHARDQ_BROKER_URL="sqs://",
                SHARDQ_ENDPOINT_URL=server.endpoint_url,
                SHARDQ_REGION="us-east-1",
            )
            if state is not None:
                running = server

                def stop() -> None:
                    emu.stop(running, timeout=60)  # SIGTERM: ministack saves its state

                def start() -> None:
                    running.pid = emu.start(port=running.port, state_dir=state).pid

                outage = chaos.Outage(stop, start)
        started = time.monotonic()

        def say(line: str) -> None:
            print(f"  [{time.monotonic() - started:6.1f} s] {line}", flush=True)

        report = chaos.run(settings, env, work, outage, say=say)
    finally:
        if server is not None:
            emu.stop(server)
    print(report.summary())
    if not report.ok:
        print(report.details())
    with open(work / "report.json", "w") as out:
        chaos.write_json(report, out)
    if not args.keep and report.ok:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()
    else:
        print(f"# kept: {work}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
