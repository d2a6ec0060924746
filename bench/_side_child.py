"""One side's measurement, run in a child process by the side-by-side benchmarks.

``python bench/_side_child.py '<json spec>'`` with ``PYTHONPATH=<checkout>:<bench>``
and ``LANE_CHECKOUT=<checkout>`` (see ``_sides.Side.env``). Prints one line
``RESULT <json>`` on stdout; logs go to stderr. It imports nothing from ``_common``
(which would put this repository's shardq first on the path) and uses only the
public surface both sides share: ``shardq.App``/``Config``/``Worker``,
``shardq.logs.configure``, ``shardq.node.Node(app, plan, until_empty=True).run()``,
``app.plan(threads=...)``, ``app.ensure_queues()``, ``app.broker`` and the broker's
``receive``/``delete_batch``.

Commands (``spec["cmd"]``):

* ``sqs``: publish then run a node on SQS (scenario ``blank`` or ``failing``);
* ``publish``: only publish ledger jobs with a config file (for ``shutdown_times``);
* ``embedded``: raw broker drain (1 and T threads) and a node, on SQLite files.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


def check_origin() -> str:
    import shardq

    origin = Path(shardq.__file__).resolve()
    expected = Path(os.environ["LANE_CHECKOUT"]).resolve()
    if not origin.is_relative_to(expected):
        sys.exit(f"shardq imported from {origin}, not from {expected}; check PYTHONPATH")
    return str(origin.parent)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proxy_counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/__proxy/counts", timeout=10) as r:
        counts: dict[str, int] = json.loads(r.read())
        return counts


def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}


def make_jobs(jobs: int, entities: int) -> list[tuple[str, dict[str, int]]]:
    """Job i belongs to ``entity-{i % entities}`` and is number ``i // entities`` there."""
    return [(f"entity-{i % entities}", {"seq": i // entities}) for i in range(jobs)]


def run_node(app: Any, threads: int) -> dict[str, Any]:
    """``Node(app, plan, until_empty=True).run()``, timed and CPU-counted around the run."""
    import lane_worker

    from shardq.node import Node

    node = Node(app, app.plan(threads=threads), until_empty=True)
    done_before = lane_worker.PROGRESS.count
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    code = node.run()
    run_s, cpu_s = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {
        "code": code,
        "run_s": run_s,
        "busy_s": lane_worker.PROGRESS.last - t0,
        "cpu_s": cpu_s,
        "processed": lane_worker.PROGRESS.count - done_before,
    }


def cmd_sqs(spec: dict[str, Any]) -> dict[str, Any]:
    import lane_worker

    import shardq
    import shardq.logs

    shardq.logs.configure(fmt="json", level=spec["log_level"])
    if spec["scenario"] == "blank":
        app, worker = lane_worker.blank_app, lane_worker.Blank
    else:
        app, worker = lane_worker.ledger_app, lane_worker.Ledger
    app.configure(
        shardq.Config(
            broker_url="sqs://",
            region="us-east-1",
            endpoint_url=spec["endpoint"],
            queue_prefix=spec["prefix"],
            threads=spec["threads"],
            idle_wait_seconds=spec["idle_wait"],
            workers={worker.__name__: {"shards": spec["shards"]}},
        )
    )
    app.ensure_queues()
    jobs = make_jobs(spec["jobs"], spec["entities"])
    c0 = proxy_counts(spec["port"])
    t0 = time.perf_counter()
    report = worker.publish_many(jobs)
    publish_s = time.perf_counter() - t0
    c1 = proxy_counts(spec["port"])
    out = run_node(app, spec["threads"])
    c2 = proxy_counts(spec["port"])
    return {
        **out,
        "published": len(report.message_ids),
        "publish_s": publish_s,
        "publish_requests": diff(c0, c1),
        "process_requests": diff(c1, c2),
    }


def cmd_publish(spec: dict[str, Any]) -> dict[str, Any]:
    import lane_worker

    import shardq

    lane_worker.ledger_app.configure(shardq.Config.load(spec["config"]))
    lane_worker.ledger_app.ensure_queues()
    report = lane_worker.Ledger.publish_many(make_jobs(spec["jobs"], spec["entities"]))
    return {"published": len(report.message_ids)}


def drain(broker: Any, queues: list[str]) -> int:
    """Receive 10 (no wait) and delete them, per queue until it is empty."""
    done = 0
    for queue in queues:
        while True:
            msgs = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=60)
            if not msgs:
                break
            broker.delete_batch(queue, [m.receipt for m in msgs])
            done += len(msgs)
    return done


def send_raw(broker: Any, queues: list[str], bodies: list[tuple[str, str, str]]) -> None:
    """Send ``bodies`` ((queue, group, body)) with ``send_batch``, 10 per call, per queue."""
    from shardq.broker.base import SendEntry

    by_queue: dict[str, list[SendEntry]] = {}
    for i, (queue, group, body) in enumerate(bodies):
        entries = by_queue.setdefault(queue, [])
        entries.append(SendEntry(str(len(entries) % 10), body, group, f"raw-{i}"))
    for queue, entries in by_queue.items():
        for start in range(0, len(entries), 10):
            broker.send_batch(queue, entries[start : start + 10])


def drain_threads(
    broker: Any, queues: list[str], n: int, bodies: list[tuple[str, str, str]]
) -> dict[str, Any]:
    """``n`` threads, thread i sending to, then draining, queues i, i + n, ...; timed
    and CPU-counted (send + receive + delete: the broker's work for each job)."""
    counts = [0] * n

    def work(i: int) -> None:
        mine = set(queues[i::n])
        send_raw(broker, queues[i::n], [b for b in bodies if b[0] in mine])
        counts[i] = drain(broker, queues[i::n])

    pool = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    run_s, cpu_s = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"run_s": run_s, "busy_s": run_s, "cpu_s": cpu_s, "processed": sum(counts)}


def cmd_embedded(spec: dict[str, Any]) -> dict[str, Any]:
    import lane_worker

    import shardq
    import shardq.logs

    defaults = shardq.Config()  # the CLI's log setup: logs.configure(format, level) to stderr
    shardq.logs.configure(defaults.log_format, defaults.log_level)
    app, threads, shards = lane_worker.blank_app, spec["threads"], spec["shards"]
    out: dict[str, Any] = {"log": f"{defaults.log_format}/{defaults.log_level}"}
    for phase in ("raw-1", f"raw-{threads}", "node"):
        path = os.path.join(spec["dir"], f"{phase}.db")
        app.configure(
            shardq.Config(
                broker_url=f"sqlite:///{path}",
                threads=threads,
                workers={"Blank": {"shards": shards}},
            )
        )
        app.ensure_queues()
        lane_worker.Blank.publish_many(make_jobs(spec["jobs"], spec["entities"]))
        if phase == "node":
            out[phase] = run_node(app, threads)
            continue
        queues = [app.shard_queue("Blank", s) for s in range(shards)]
        bodies = []  # what publish_many queued, taken out again (not timed) to send raw
        for queue in queues:
            while batch := app.broker.receive(
                queue, max_messages=10, wait_seconds=0, visibility_timeout=60
            ):
                bodies += [(queue, m.group_id, m.body) for m in batch]
                app.broker.delete_batch(queue, [m.receipt for m in batch])
        out[phase] = drain_threads(
            app.broker, queues, 1 if phase == "raw-1" else threads, bodies
        )
    app.broker.close()
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    origin = check_origin()
    commands = {"sqs": cmd_sqs, "publish": cmd_publish, "embedded": cmd_embedded}
    result = commands[spec["cmd"]](spec)
    result["shardq"] = origin
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
