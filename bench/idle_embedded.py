"""Idle cost of a node on the embedded broker with many shards: CPU, threads, pickup.

Exact command (from the repo root)::

    python bench/idle_embedded.py --shards 1000 --threads 8 --window 10

A worker with ``--shards`` shards on a fresh SQLite file in a temporary directory and a
node with ``--threads`` threads run in this process (logs at warning). After 5 s of
settling, the process's CPU time (``resource.getrusage``, all threads) is taken over
``--window`` seconds with no job: the share of one core the idle node uses. Then the
threads alive in the process, and the pickup time of one published job (publish call
to the node counting it as done). Goal: under 2 % of a core, threads at most
``--threads`` + a small constant.
"""

from __future__ import annotations

import argparse
import logging
import resource
import tempfile
import threading
import time

import structlog
from _common import git_head, machine

import shardq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    print(f"shardq idle embedded node  git {git_head()}\nmachine: {machine()}")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    path = f"{tempfile.mkdtemp(prefix='shardq-idle-')}/broker.db"
    app = shardq.App(shardq.Config(broker_url=f"sqlite:///{path}", threads=args.threads))

    class Blank(shardq.Worker, app=app):
        shards = args.shards

        def perform(self, entity_id: str, payloads: list[object]) -> None:
            pass

    app.ensure_queues()
    node = app.node(app.plan(threads=args.threads))
    runner = threading.Thread(target=node.run)
    runner.start()
    time.sleep(5.0)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(args.window)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    share = cpu / (time.monotonic() - started)
    threads = threading.active_count()
    published = time.monotonic()
    Blank.publish("some-entity", {})
    while not node.tally().succeeded.get("Blank"):
        time.sleep(0.0005)
    pickup = time.monotonic() - published
    node.stop()
    runner.join()
    print(
        f"shards={args.shards} threads={args.threads}: idle CPU {share * 100:.2f} % of a core "
        f"over {args.window:.0f} s; {threads} threads in the process; pickup "
        f"{pickup * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
