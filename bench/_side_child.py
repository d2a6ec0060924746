"""One side's measurement, run in a child process by the side-by-side benchmarks.

``python bench/_side_child.py '<json spec>'`` with ``PYTHONPATH=<checkout>:<bench>``
and ``LANE_CHECKOUT=<checkout>`` (see ``_sides.Side.env``). Prints one line
``RESULT <json>`` on stdout; logs go to stderr. It imports nothing from ``_common``
(which would put this repository's shardq first on the path) and uses only the
public surface both sides share: ``shardq.App``/``Config``/``Worker``,
``shardq.ops.logs.configure``, ``app.node(plan, until_empty=True).run()``,
``app.plan(threads=...)``, ``app.ensure_queues()``, ``app.broker`` and the broker's
``receive``/``delete_batch``.

Commands (``spec["cmd"]``):

* ``sqs``: publish then run a node on SQS (scenario ``blank`` or ``failing``);
* ``publish``: only publish ledger jobs with a config file (for ``shutdown_times``);
* ``embedded``: raw broker drain (1 and T threads) and a node, on SQLite files;
* ``io``: I/O-bound jobs (``lane_worker.Sleep`` or ``SleepAsync``) published then run
  by a node, on a SQLite file or on SQS (``bench/io_bound.py``).
"""

from __future__ import annotations

import json
import os
import re
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


class CpuTrace(threading.Thread):
    """The process's CPU seconds sampled every ``every`` s (``perf_counter``, CPU), so
    the CPU spent up to a moment within the run can be told (:meth:`at`)."""

    def __init__(self, every: float = 0.05) -> None:
        super().__init__(name="cpu-trace", daemon=True)
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), cpu_seconds()))
            if self.done.wait(self.every):
                return

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.samples.append((time.perf_counter(), cpu_seconds()))

    def at(self, moment: float) -> float:
        """CPU seconds at ``moment``, interpolated between the samples around it."""
        before = [s for s in self.samples if s[0] <= moment]
        after = [s for s in self.samples if s[0] >= moment]
        if not before or not after:
            return (before or after)[-1 if before else 0][1]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (moment - t0) / (t1 - t0)


class ThreadCpu(threading.Thread):
    """CPU seconds per thread of this process while the node runs, summed by thread
    name with its number dropped (``shardq-io_3`` and ``shardq-io_5`` are
    ``shardq-io``): read from ``/proc/self/task/<tid>/schedstat`` (Linux) every
    ``every`` s, so threads that end before the run does are still counted."""

    def __init__(self, every: float = 0.05) -> None:
        super().__init__(name="thread-cpu", daemon=True)
        self.every = every
        self.done = threading.Event()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.names: dict[int, str] = {}

    @staticmethod
    def _read() -> dict[int, float]:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[int(tid)] = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
        return out

    def run(self) -> None:
        self.first = self._read()
        while not self.done.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        for t in threading.enumerate():
            if t.native_id is not None:
                self.names[t.native_id] = re.sub(r"([-_]\d+|\[\d+\])$", "", t.name)
        self.last.update(self._read())

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.join()
        self._sample()
        out: dict[str, float] = {}
        for tid, seconds in self.last.items():
            name = self.names.get(tid, "other")
            if name != self.name:
                out[name] = out.get(name, 0.0) + seconds - self.first.get(tid, 0.0)
        return out


def make_node(app: Any, plan: Any, **options: Any) -> Any:
    """``app.node(plan, ...)``; a checkout from before the layered packages has no
    ``App.node``: its ``shardq.node.Node(app, plan, ...)``."""
    if hasattr(app, "node"):
        return app.node(plan, **options)
    import importlib

    return importlib.import_module("shardq.node").Node(app, plan, **options)


def configure_logs(*args: Any, **kwargs: Any) -> None:
    """``shardq.ops.logs.configure`` (``shardq.logs`` before the layered packages)."""
    import importlib

    try:
        logs = importlib.import_module("shardq.ops.logs")
    except ImportError:
        logs = importlib.import_module("shardq.logs")
    logs.configure(*args, **kwargs)


def run_node(app: Any, threads: int, thread_cpu: bool = False) -> dict[str, Any]:
    """``Node(app, plan, until_empty=True).run()``, timed and CPU-counted around the run
    (``cpu_s``) and up to the end of the last job (``busy_cpu_s``: without the
    until-empty detection and the shutdown)."""
    import lane_worker

    node = make_node(app, app.plan(threads=threads), until_empty=True)
    done_before = lane_worker.PROGRESS.count
    trace = CpuTrace()
    trace.start()
    per_thread = ThreadCpu() if thread_cpu else None
    if per_thread is not None:
        per_thread.start()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    code = node.run()
    run_s, cpu_s = time.perf_counter() - t0, cpu_seconds() - cpu0
    trace.stop()
    extra = {"thread_cpu_s": per_thread.stop()} if per_thread is not None else {}
    return {
        **extra,
        "code": code,
        "run_s": run_s,
        "busy_s": lane_worker.PROGRESS.last - t0,
        "cpu_s": cpu_s,
        "busy_cpu_s": trace.at(lane_worker.PROGRESS.last) - cpu0,
        "processed": lane_worker.PROGRESS.count - done_before,
    }


def cmd_sqs(spec: dict[str, Any]) -> dict[str, Any]:
    import lane_worker

    import shardq

    configure_logs(fmt="json", level=spec["log_level"])
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
    out = run_node(app, spec["threads"], bool(spec.get("thread_cpu")))
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

    defaults = shardq.Config()  # the CLI's log setup: logs.configure(format, level) to stderr
    configure_logs(defaults.log_format, defaults.log_level)
    app, threads, shards = lane_worker.blank_app, spec["threads"], spec["shards"]
    out: dict[str, Any] = {"log": f"{defaults.log_format}/{defaults.log_level}"}
    for phase in dict.fromkeys(("raw-1", f"raw-{threads}", "node")):  # raw-1 once if T = 1
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
        out[phase] = drain_threads(app.broker, queues, 1 if phase == "raw-1" else threads, bodies)
    app.broker.close()
    return out


def cmd_io(spec: dict[str, Any]) -> dict[str, Any]:
    import dataclasses

    import lane_worker

    import shardq

    os.environ["LANE_SLEEP_MS"] = str(spec["sleep_ms"])
    configure_logs(fmt="json", level="warning")
    if spec["kind"] == "async":
        app, worker = lane_worker.io_async_app, lane_worker.SleepAsync
    else:
        app, worker = lane_worker.io_app, lane_worker.Sleep
    settings: dict[str, Any] = {
        "queue_prefix": spec["prefix"],
        "threads": spec["threads"],
        "idle_wait_seconds": 1,
        "progress_seconds": 0,
        "workers": {worker.__name__: {"shards": spec["shards"]}},
    }
    if "concurrency" in {f.name for f in dataclasses.fields(shardq.Config)}:  # not before it
        settings["concurrency"] = spec["concurrency"]
    if spec["broker"] == "sqs":
        settings.update(broker_url="sqs://", region="us-east-1", endpoint_url=spec["endpoint"])
    else:
        settings["broker_url"] = f"sqlite:///{os.path.join(spec['dir'], 'io.db')}"
    app.configure(shardq.Config(**settings))
    app.ensure_queues()
    port = spec.get("port")
    c0 = proxy_counts(port) if port else {}
    report = worker.publish_many(make_jobs(spec["jobs"], spec["entities"]))
    c1 = proxy_counts(port) if port else {}
    out = run_node(app, spec["threads"])
    c2 = proxy_counts(port) if port else {}
    return {
        **out,
        "published": len(report.message_ids),
        "peak": lane_worker.PEAK.most,
        "publish_requests": diff(c0, c1),
        "process_requests": diff(c1, c2),
        "concurrency": settings.get("concurrency"),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    origin = check_origin()
    commands = {"sqs": cmd_sqs, "publish": cmd_publish, "embedded": cmd_embedded, "io": cmd_io}
    result = commands[spec["cmd"]](spec)
    result["shardq"] = origin
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
