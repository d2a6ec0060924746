"""Helpers shared by the peer benchmarks (bench/peers/): job records, order checks,
process-tree CPU, the worker start gate, and stopping processes by pid.

Every job of every system, when it succeeds, appends one line to a records file:
``entity seq time pid``. A single ``os.write`` on an ``O_APPEND`` descriptor, so
lines from threads and processes never interleave. The runners read that file to
know when a run is done and to count order violations.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
for _p in (str(BENCH), str(ROOT)):  # ``_common`` and ``tests.emulator``
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _common import git_head, machine, percentile, table  # noqa: E402

__all__ = ["git_head", "machine", "percentile", "table"]

RECORDS_ENV = "PEERS_RECORDS"
FAIL_ENV = "PEERS_FAIL_RATE"
_fd: dict[tuple[int, str], int] = {}


# -- inside the workers ---------------------------------------------------------------
def record(entity: str, seq: int, suffix: str = "") -> None:
    """Append one success line (called by every system's job function)."""
    key = (os.getpid(), suffix)
    fd = _fd.get(key)
    if fd is None:
        fd = _fd[key] = os.open(
            os.environ[RECORDS_ENV] + suffix, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
    os.write(fd, f"{entity} {seq} {time.time():.6f} {key[0]}\n".encode())


def maybe_fail(entity: str, seq: int) -> None:
    """Raise for a share of attempts (PEERS_FAIL_RATE, e.g. 0.1): the injected failure.
    Each injected failure is logged to ``<records>.fail`` (same line format)."""
    rate = float(os.environ.get(FAIL_ENV, "0") or 0)
    if rate and random.random() < rate:
        record(entity, seq, suffix=".fail")
        raise RuntimeError("injected failure")


def job(entity: str, seq: int) -> None:
    """The blank job (or one waiting ``$PEERS_SLEEP_MS`` first, as I/O would): maybe
    fail, else record the success."""
    wait = float(os.environ.get("PEERS_SLEEP_MS", "0") or 0)
    if wait:
        time.sleep(wait / 1000)
    maybe_fail(entity, seq)
    record(entity, seq)


def wait_for_go(ready_path: str) -> None:
    """Tell the runner this worker is imported and configured, then wait for "go"
    on stdin. The runner reads the process's CPU time in between, so imports and
    set-up before this point are not counted."""
    Path(ready_path).write_text(str(os.getpid()))
    sys.stdin.readline()


# -- the job list ---------------------------------------------------------------------
def make_jobs(n: int, entities: int, seed: int = 7) -> list[tuple[str, int]]:
    """``n`` jobs over ``entities`` entities, entity order random (seeded) so that
    consecutive jobs of one entity sit close together, as they do in real traffic.
    Each entity's jobs carry sequence numbers 1, 2, 3, ... in publish order."""
    rng = random.Random(seed)
    seqs = [0] * entities
    jobs = []
    for _ in range(n):
        e = rng.randrange(entities)
        seqs[e] += 1
        jobs.append((f"e{e}", seqs[e]))
    return jobs


# -- reading results --------------------------------------------------------------------
class RecordTail:
    """Reads a records file incrementally; knows how many distinct jobs succeeded."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.lines: list[tuple[str, int, float, int]] = []
        self.distinct: set[tuple[str, int]] = set()

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return 0
        self.offset += len(data)
        data = self.rest + data
        *complete, self.rest = data.split(b"\n")
        for raw in complete:
            entity, seq, t, pid = raw.decode().split()
            self.lines.append((entity, int(seq), float(t), int(pid)))
            self.distinct.add((entity, int(seq)))
        return len(self.distinct)


@dataclass
class OrderReport:
    successes: int = 0
    distinct: int = 0
    duplicates: int = 0
    missing: int = 0
    entities: int = 0
    entities_out_of_order: int = 0
    inversions: int = 0  # success lines whose seq is below an earlier success's seq
    examples: list[str] = field(default_factory=list)


def order_report(lines: Iterable[tuple[str, int, float, int]], jobs: list[tuple[str, int]]):
    """Per entity, successes must come in sequence order. An entity is out of order
    when some success of seq n comes after a success of a higher seq (a re-run of a
    job already done, right after it, is a duplicate, not a violation)."""
    expected = {}
    for entity, seq in jobs:
        expected[entity] = max(expected.get(entity, 0), seq)
    rep = OrderReport(entities=len(expected))
    highest: dict[str, int] = {}
    bad: set[str] = set()
    seen: set[tuple[str, int]] = set()
    for entity, seq, _t, _pid in lines:
        rep.successes += 1
        if (entity, seq) in seen:
            rep.duplicates += 1
        seen.add((entity, seq))
        top = highest.get(entity, 0)
        if seq < top:
            rep.inversions += 1
            if entity not in bad and len(rep.examples) < 3:
                rep.examples.append(f"{entity}: {seq} after {top}")
            bad.add(entity)
        highest[entity] = max(top, seq)
    rep.distinct = len(seen)
    rep.missing = sum(expected.values()) - len(seen & set(jobs))
    rep.entities_out_of_order = len(bad)
    return rep


# -- CPU and processes ------------------------------------------------------------------
def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants, live or reaped
    (a reaped child's time is in its parent's ``children_*`` fields)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_pids(proc: subprocess.Popen, *, grace: float = 3.0, second_term: bool = True) -> None:
    """Stop a worker we started, and whatever it forked, by pid: SIGTERM (twice for
    frameworks whose second signal means "now"), then SIGKILL what is left."""
    pids = descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            if second_term:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    deadline = time.monotonic() + grace
    for pid in pids:
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def loadavg1() -> float:
    return os.getloadavg()[0]


# -- the counting proxy -----------------------------------------------------------------
def proxy_counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/__proxy/counts", timeout=10) as resp:
        return json.loads(resp.read())


def count_diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) - a.get(k, 0)}


def sqs_requests(counts: dict[str, int]) -> int:
    """Requests in a count dict (the ReceiveMessage:with/empty split is not extra)."""
    return sum(v for k, v in counts.items() if ":" not in k)


def versions(names: Iterable[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


# -- one gated worker run -----------------------------------------------------------------
def measure_worker(
    cmd: list[str],
    *,
    env: dict[str, str],
    ready: str,
    records: str,
    jobs: int,
    log_path: str,
    timeout: float,
    settle: float,
    side_pids: dict[str, int] | None = None,
    at_go=None,
    at_end=None,
) -> dict:
    """Start a worker, wait until it is ready, read its process tree's CPU time, say
    "go", wait until ``jobs`` distinct jobs have a success line (or ``timeout``), wait
    ``settle`` s, read the CPU time again, stop the worker tree by pid.

    Returns jobs/s (jobs / (last success - go)), worker CPU ms per job over the whole
    run and between 10 % and 90 % of the jobs, the CPU of ``side_pids`` (emulator,
    proxy, Redis: not the worker's) per job, and the success lines.
    ``at_go``/``at_end`` are called right before "go" and after the settle time."""
    side_pids = side_pids or {}
    res: dict = {}
    log = open(log_path, "w")  # noqa: SIM115
    worker = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(HERE)
    )
    tail = RecordTail(records)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            if worker.poll() is not None or time.monotonic() > deadline:
                res["error"] = f"worker did not get ready (exit {worker.poll()}); see {log_path}"
                return res
            time.sleep(0.02)
        time.sleep(0.2)  # let it block on stdin
        cpu0 = tree_cpu(worker.pid)
        side0 = {k: tree_cpu(p) for k, p in side_pids.items()}
        if at_go:
            at_go()
        res["load1_go"] = loadavg1()
        t_go = time.time()
        worker.stdin.write(b"go\n")
        worker.stdin.flush()
        deadline = time.monotonic() + timeout
        marks: list[tuple[int, float]] = []  # (jobs done, worker CPU) at 10 % and 90 %
        while (got := tail.poll()) < jobs:
            if len(marks) < 2 and got >= jobs * (0.1 if not marks else 0.9):
                marks.append((got, tree_cpu(worker.pid)))
            if worker.poll() is not None or time.monotonic() > deadline:
                res["error"] = (
                    f"incomplete: {len(tail.distinct)}/{jobs} jobs succeeded "
                    f"(worker exit {worker.poll()}); see {log_path}"
                )
                break
            time.sleep(0.02)
        time.sleep(settle)
        tail.poll()
        cpu1 = tree_cpu(worker.pid)
        side1 = {k: tree_cpu(p) for k, p in side_pids.items()}
        if at_end:
            at_end()
    finally:
        stop_pids(worker)
        log.close()

    done = len(tail.distinct)
    times = [t for _, _, t, _ in tail.lines]
    if times:
        res["elapsed_s"] = max(times) - t_go
        res["first_s"] = min(times) - t_go
        res["jobs_per_s"] = done / res["elapsed_s"] if res["elapsed_s"] > 0 else float("nan")
    res["done"] = done
    res["worker_cpu_s"] = cpu1 - cpu0
    res["cpu_ms_per_job"] = (cpu1 - cpu0) / max(done, 1) * 1000
    if len(marks) == 2 and marks[1][0] > marks[0][0]:
        res["steady_cpu_ms_per_job"] = (
            (marks[1][1] - marks[0][1]) / (marks[1][0] - marks[0][0]) * 1000
        )
    for k in side_pids:
        res[f"{k}_cpu_ms_per_job"] = (side1[k] - side0[k]) / max(done, 1) * 1000
    res["lines"] = tail.lines
    failed = RecordTail(records + ".fail")
    failed.poll()
    res["injected_failures"] = len(failed.lines)
    res["load1_end"] = loadavg1()
    return res


def publish_shardq(app_and_worker: Any, jobs: list[tuple[str, int]]) -> None:
    """Publish ``(entity, n)`` jobs with shardq's ``publish_many``."""
    app, worker = app_and_worker
    app.ensure_queues()
    report = worker.publish_many([(e, {"n": n}) for e, n in jobs])
    assert report.sent == len(jobs), report


def work_shardq(app: Any, threads: int, ready_file: str) -> None:
    """Run a shardq node once the driver says go; exit with its code."""

    node = app.node(app.plan(threads=threads))
    wait_for_go(ready_file)
    sys.exit(node.run())
