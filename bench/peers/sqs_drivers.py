"""One driver per system for the SQS comparison: ``publish`` and ``work``.

Systems: ``shardq``, ``celery`` (kombu SQS transport, prefork pool),
``celery-threads`` (the same with ``-P threads``), ``sqs-workers``, ``dramatiq``
(dramatiq-sqs). Every job is ``(entity, seq)``; on success it appends a line to the
records file (``$PEERS_RECORDS``); ``$PEERS_FAIL_RATE`` makes that share of
attempts raise. The runner (``compare_sqs.py``) calls this script; to drive one
system by hand::

    python bench/peers/sqs_drivers.py publish --system celery --endpoint http://127.0.0.1:PORT \
        --prefix t1- --jobs 2000 --entities 100
    PEERS_RECORDS=/tmp/r.txt python bench/peers/sqs_drivers.py work --system celery \
        --endpoint http://127.0.0.1:PORT --prefix t1- --concurrency 4 --ready-file /tmp/ready

``work`` imports and configures everything, writes ``--ready-file``, then waits for a
line on stdin before it starts consuming (so the runner can leave imports out of
the CPU it measures). It runs until stopped with SIGTERM.

How each system is configured (FIFO wherever the library can do it):

* shardq: ``SqsBroker(endpoint_url=...)``, one worker with ``--shards`` FIFO queues
  (default 4), ``batch_size`` 1, ``max_retries`` 20, ``retry_in`` 1 s, a node with
  ``--concurrency`` threads, log level warning; publishes with ``publish_many``.
* celery: queue ``<prefix>celery.fifo`` (FIFO), ``apply_async(..., MessageGroupId=
  entity)``, ``task_acks_late=True`` (delete after the task, the reliable setting),
  ``autoretry_for=(RuntimeError,)`` with ``max_retries=20``, retry countdown 1 s
  (kombu drops it on FIFO queues with a warning), no result backend, remote control
  off (it needs SNS), ``--without-gossip --without-mingle --without-heartbeat``;
  transport defaults otherwise (``wait_time_seconds`` 10, ``polling_interval`` 1 -
  ``$PEERS_CELERY_POLLING_INTERVAL`` overrides it - prefetch multiplier 4);
  ``-P prefork`` (default) or ``-P threads``, ``-c N``.
* sqs-workers: FIFO queue ``<prefix>sqsw.fifo`` created with ``create_fifo_queue``,
  JSON codec, ``add_job`` inside ``add_batch()`` (SendMessageBatch of 10) with
  ``_group_id=entity``, ``ConstantBackoff(1)`` on failure; the library runs one
  single-threaded loop per process (``process_queue``), so N processes.
* dramatiq: dramatiq-sqs has no FIFO support (no MessageGroupId; see
  ``--dramatiq-fifo``), so a standard queue; ``send`` per job; one
  ``dramatiq.Worker`` with N threads; ``max_retries=20``, backoff 1 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback

from _peers import job, make_jobs, publish_shardq, wait_for_go, work_shardq

SYSTEMS = ("shardq", "celery", "celery-threads", "sqs-workers", "dramatiq")
REGION = "us-east-1"


def aws_env() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)


# -- shardq ----------------------------------------------------------------------------
def shardq_app(args: argparse.Namespace):
    import shardq
    import shardq.ops.logs
    from shardq.broker.sqs import SqsBroker

    shardq.ops.logs.configure(fmt="json", level="warning", stream=open(os.devnull, "w"))  # noqa: SIM115
    # a thread per shard at most receives; concurrency runs the jobs
    threads = min(args.concurrency, args.shards)
    config = shardq.Config(threads=threads, concurrency=args.concurrency, queue_prefix=args.prefix)
    app = shardq.App(config, broker=SqsBroker(region=REGION, endpoint_url=args.endpoint))

    class Blank(shardq.Worker):
        shards = args.shards
        batch_size = 1
        max_retries = 20
        visibility_timeout = 60

        def perform(self, entity_id: str, payloads: list) -> None:
            for payload in payloads:
                job(entity_id, payload["n"])

        def retry_in(self, attempt: int) -> float:
            return 1.0

    app.register(Blank)
    return app, Blank


def shardq_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    publish_shardq(shardq_app(args), jobs)


def shardq_work(args: argparse.Namespace) -> None:
    work_shardq(shardq_app(args)[0], min(args.concurrency, args.shards), args.ready_file)


# -- celery ----------------------------------------------------------------------------
def celery_app(args: argparse.Namespace):
    from celery import Celery

    port = args.endpoint.rsplit(":", 1)[1].rstrip("/")
    app = Celery("peers", broker=f"sqs://test:test@127.0.0.1:{port}")
    queue = f"{args.prefix}celery.fifo"
    app.conf.update(
        broker_transport_options={
            "region": REGION,
            "is_secure": False,
            "visibility_timeout": 60,
            **(
                {"polling_interval": float(os.environ["PEERS_CELERY_POLLING_INTERVAL"])}
                if os.environ.get("PEERS_CELERY_POLLING_INTERVAL")
                else {}
            ),
        },
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_acks_late=True,
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
    )

    @app.task(
        name="peers.job",
        bind=True,
        autoretry_for=(RuntimeError,),
        max_retries=20,
        default_retry_delay=1,
        retry_jitter=False,
    )
    def cjob(self, entity: str, seq: int) -> None:
        job(entity, seq)

    return app, cjob, queue


def celery_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    app, cjob, _ = celery_app(args)
    with app.producer_or_acquire() as producer:
        for entity, seq in jobs:
            cjob.apply_async((entity, seq), MessageGroupId=entity, producer=producer)


def celery_work(args: argparse.Namespace, pool: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    app, _, queue = celery_app(args)
    argv = [
        "worker",
        "-P",
        pool,
        "-c",
        str(args.concurrency),
        "-Q",
        queue,
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    wait_for_go(args.ready_file)
    app.worker_main(argv)


# -- sqs-workers -----------------------------------------------------------------------
class EndpointSession:
    """What sqs-workers calls ``session``: boto3 with our endpoint (SQSEnv has no
    endpoint option of its own)."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.session = boto3.Session(region_name=REGION)

    def client(self, name: str, **kw):
        return self.session.client(name, endpoint_url=self.endpoint, **kw)

    def resource(self, name: str, **kw):
        return self.session.resource(name, endpoint_url=self.endpoint, **kw)


def sqsw_env(args: argparse.Namespace):
    from sqs_workers import ConstantBackoff, SQSEnv

    env = SQSEnv(session=EndpointSession(args.endpoint), queue_prefix=args.prefix, codec="json")
    queue = env.queue("sqsw.fifo", backoff_policy=ConstantBackoff(1))

    @queue.processor("job")
    def sjob(entity: str, seq: int) -> None:
        job(entity, seq)

    return env, queue, sjob


def sqsw_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    from sqs_workers import create_fifo_queue

    env, queue, sjob = sqsw_env(args)
    create_fifo_queue(env, "sqsw.fifo", visibility_timeout=60)
    with queue.add_batch():
        for entity, seq in jobs:
            sjob.delay(
                entity=entity, seq=seq, _group_id=entity, _deduplication_id=f"{entity}-{seq}"
            )


def sqsw_child(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.CRITICAL)  # the library logs every failure with a traceback
    _, queue, _ = sqsw_env(args)  # fresh clients in each process
    queue.process_queue(wait_second=10)


def sqsw_work(args: argparse.Namespace) -> None:
    import multiprocessing

    import sqs_workers  # noqa: F401 - imported before "go"

    ctx = multiprocessing.get_context("fork")
    wait_for_go(args.ready_file)
    children = [ctx.Process(target=sqsw_child, args=(args,)) for _ in range(args.concurrency)]
    for child in children:
        child.start()

    def stop(*_: object) -> None:
        for child in children:
            if child.is_alive():
                child.terminate()
        for child in children:
            child.join(5)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    for child in children:
        child.join()


# -- dramatiq --------------------------------------------------------------------------
def dramatiq_setup(args: argparse.Namespace):
    import dramatiq
    from dramatiq_sqs import SQSBroker

    broker = SQSBroker(
        namespace=args.prefix.rstrip("-_") or None,
        endpoint_url=args.endpoint,
        region_name=REGION,
        visibility_timeout=60,
    )
    dramatiq.set_broker(broker)
    queue_name = "djobs.fifo" if args.dramatiq_fifo else "djobs"

    @dramatiq.actor(
        queue_name=queue_name, max_retries=20, min_backoff=1000, max_backoff=1000, actor_name="job"
    )
    def djob(entity: str, seq: int) -> None:
        job(entity, seq)

    return broker, djob


def dramatiq_publish(args: argparse.Namespace, jobs: list[tuple[str, int]]) -> None:
    broker, djob = dramatiq_setup(args)
    if args.dramatiq_fifo:  # make the FIFO queue first: dramatiq-sqs would create a standard one
        name = f"{broker.namespace}_djobs.fifo" if broker.namespace else "djobs.fifo"
        broker.sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
    for entity, seq in jobs:
        djob.send(entity, seq)


def dramatiq_work(args: argparse.Namespace) -> None:
    import dramatiq

    logging.basicConfig(level=logging.CRITICAL)  # a traceback per injected failure otherwise
    broker, _ = dramatiq_setup(args)
    wait_for_go(args.ready_file)
    worker = dramatiq.Worker(broker, worker_threads=args.concurrency)
    worker.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    worker.stop(timeout=2000)


# -- CLI -------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("publish", "work"))
    parser.add_argument("--system", choices=SYSTEMS, required=True)
    parser.add_argument("--endpoint", required=True, help="SQS endpoint (the counting proxy)")
    parser.add_argument("--prefix", required=True, help="queue name prefix for this run")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4, help="threads or processes")
    parser.add_argument("--shards", type=int, default=4, help="shardq shards")
    parser.add_argument("--ready-file", help="work: written when ready for 'go'")
    parser.add_argument(
        "--dramatiq-fifo", action="store_true", help="try dramatiq-sqs on a FIFO queue"
    )
    args = parser.parse_args()
    aws_env()
    if args.action == "publish":
        jobs = make_jobs(args.jobs, args.entities)
        t0 = time.perf_counter()
        try:
            {
                "shardq": shardq_publish,
                "celery": celery_publish,
                "celery-threads": celery_publish,
                "sqs-workers": sqsw_publish,
                "dramatiq": dramatiq_publish,
            }[args.system](args, jobs)
        except Exception as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            traceback.print_exc()
            sys.exit(1)
        print(json.dumps({"publish_s": time.perf_counter() - t0, "jobs": len(jobs)}))
        return
    if args.system == "shardq":
        shardq_work(args)
    elif args.system in ("celery", "celery-threads"):
        celery_work(args, "threads" if args.system == "celery-threads" else "prefork")
    elif args.system == "sqs-workers":
        sqsw_work(args)
    else:
        dramatiq_work(args)


if __name__ == "__main__":
    main()
