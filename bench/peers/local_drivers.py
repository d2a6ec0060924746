"""One driver per system for the one-machine comparison: ``publish`` and ``work``.

Systems: ``shardq`` (embedded SQLite broker), ``huey`` (``SqliteHuey``), ``rq``
(Redis; RQ's default ``Worker``, which forks a work horse per job) and ``rq-simple``
(RQ's ``SimpleWorker``, which runs jobs in the worker process). Every job is
``(entity, seq)`` and appends a success line to ``$PEERS_RECORDS``. The runner
(``compare_local.py``) calls this script; by hand::

    python bench/peers/local_drivers.py publish --system huey --path /tmp/h.db --jobs 20000
    PEERS_RECORDS=/tmp/r.txt python bench/peers/local_drivers.py work --system huey \
        --path /tmp/h.db --concurrency 4 --ready-file /tmp/ready

How each system is configured:

* shardq: ``SqliteBroker(path)``, a worker with ``--shards`` shards (default 8),
  ``batch_size`` 1, a node with ``--concurrency`` threads in one process, log level
  warning; publishes with ``publish_many``.
* huey: ``SqliteHuey(filename=path)`` with its defaults (results on, ``None`` not
  stored), ``enqueue`` per job (huey has no bulk enqueue); a consumer with
  ``--concurrency`` worker threads, periodic tasks off, default polling (0.1 s initial
  delay, backoff 1.15, 10 s max) - the consumer only sleeps when a dequeue finds
  nothing.
* rq / rq-simple: ``Queue('bench', connection=Redis(port=...))``, ``enqueue_many`` of
  ``Queue.prepare_data`` (one pipeline), RQ's defaults (results kept 500 s);
  ``--concurrency`` worker processes (RQ workers are single-threaded).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time

from _peers import job, make_jobs, publish_shardq, wait_for_go, work_shardq

SYSTEMS = ("shardq", "huey", "rq", "rq-simple")


# -- shardq ----------------------------------------------------------------------------
def shardq_app(args: argparse.Namespace):
    import shardq
    import shardq.ops.logs
    from shardq.broker import SqliteBroker

    shardq.ops.logs.configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    app = shardq.App(shardq.Config(threads=args.concurrency), broker=SqliteBroker(args.path))

    class Blank(shardq.Worker):
        shards = args.shards
        batch_size = 1

        def perform(self, entity_id: str, payloads: list) -> None:
            for payload in payloads:
                job(entity_id, payload["n"])

    app.register(Blank)
    return app, Blank


def shardq_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    publish_shardq(shardq_app(args), jobs)


def shardq_work(args: argparse.Namespace) -> None:
    work_shardq(shardq_app(args)[0], args.concurrency, args.ready_file)


# -- huey ------------------------------------------------------------------------------
def huey_app(args: argparse.Namespace):
    from huey import SqliteHuey

    huey = SqliteHuey("bench", filename=args.path)

    @huey.task(name="hjob")
    def hjob(entity: str, seq: int) -> None:
        job(entity, seq)

    return huey, hjob


def huey_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    _, hjob = huey_app(args)
    for entity, seq in jobs:
        hjob(entity, seq)


def huey_work(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    huey, _ = huey_app(args)
    consumer = huey.create_consumer(workers=args.concurrency, worker_type="thread", periodic=False)
    wait_for_go(args.ready_file)
    consumer.run()


# -- rq --------------------------------------------------------------------------------
def rq_queue(args: argparse.Namespace):
    from redis import Redis
    from rq import Queue

    return Queue("bench", connection=Redis(host="127.0.0.1", port=args.redis_port))


def rq_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    from rq import Queue

    queue = rq_queue(args)
    for i in range(0, len(jobs), 1000):
        queue.enqueue_many(
            [Queue.prepare_data("_peers.job", args=(e, n)) for e, n in jobs[i : i + 1000]]
        )


def rq_child(args: argparse.Namespace, simple: bool) -> None:
    from rq import SimpleWorker, Worker

    queue = rq_queue(args)
    cls = SimpleWorker if simple else Worker
    worker = cls([queue], connection=queue.connection)
    worker.work(logging_level="WARNING", with_scheduler=False)


def rq_work(args: argparse.Namespace, simple: bool) -> None:
    import multiprocessing

    import rq  # noqa: F401 - imported before "go"

    ctx = multiprocessing.get_context("fork")
    wait_for_go(args.ready_file)
    children = [ctx.Process(target=rq_child, args=(args, simple)) for _ in range(args.concurrency)]
    for child in children:
        child.start()

    def stop(*_: object) -> None:
        for child in children:
            if child.is_alive():
                os.kill(child.pid, signal.SIGTERM)  # RQ: warm shutdown
        for child in children:
            child.join(5)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    for child in children:
        child.join()


# -- CLI -------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("publish", "work"))
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--path", help="SQLite file (shardq, huey)")
    parser.add_argument("--redis-port", type=int, help="Redis on 127.0.0.1 (rq)")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4, help="threads or processes")
    parser.add_argument("--shards", type=int, default=8, help="shardq shards")
    parser.add_argument("--ready-file", help="work: written when ready for 'go'")
    args = parser.parse_args()
    if args.action == "publish":
        jobs = make_jobs(args.jobs, args.entities)
        t0 = time.perf_counter()
        {
            "shardq": shardq_publish,
            "huey": huey_publish,
            "rq": rq_publish,
            "rq-simple": rq_publish,
        }[args.system](args, jobs)
        print(json.dumps({"publish_s": time.perf_counter() - t0, "jobs": len(jobs)}))
    elif args.system == "shardq":
        shardq_work(args)
    elif args.system == "huey":
        huey_work(args)
    else:
        rq_work(args, simple=args.system == "rq-simple")


if __name__ == "__main__":
    main()
