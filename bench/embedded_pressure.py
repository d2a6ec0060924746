"""The embedded broker under the pressures of a busy single-machine deployment.

Exact command (from the repo root)::

    python bench/embedded_pressure.py

Parts (``--parts a,b,c,d,e`` picks some; each prints a table):

* ``a`` waiting receives: the latency of one send + receive + delete on one queue
  while 8 / 200 / 1,000 other threads wait in ``receive`` (``wait_seconds=20``) on
  queues of their own (as a node's idle shards do).
* ``b`` a blocked entity: one entity with 10,000 jobs behind a head hidden by a
  visibility change (waiting out a retry). The cost of a receive on its queue, and
  the receive latency (p50/p99) of 4 threads working 8 other queues (send 1,
  receive, delete) while one thread receives from the blocked queue in a loop,
  compared with no blocked entity.
* ``c`` disk: the file plus WAL when fresh, after publishing and draining 100,000
  jobs (``--disk-jobs``; each with a 32-character deduplication id, as
  ``publish_many`` makes for a job without ``dedup_id``; ``--short-dedup-ids`` sends
  ``d<batch>-<i>`` instead, as this part did before), after ``maintain()`` right
  after the drain (a node's next maintenance, at most 30 s later; the ids are still
  in their 5-minute window: kept, as SQS would) and after ``maintain()`` once that
  window has passed (simulated instead of waiting 5 minutes: by dropping the expired
  ids on a clock 7 minutes ahead, as that maintenance would, or on versions before
  deduplication buckets by ``UPDATE dedup SET expires_at = 0``). The largest tables
  after the drain are listed from SQLite's ``dbstat``.
* ``d`` node drain: a worker with 1,000 shards vs 8 shards, one node with 8 threads,
  2,000 blank jobs over 2,000 entities, ``Node(app, plan, until_empty=True).run()``.
* ``e`` disk under a running node: ``publish_many`` of 100,000 blank jobs
  (``--disk-jobs``) over 10,000 entities and 8 shards, then a node with 4 threads
  (``Node(app, plan).run()`` in a thread, its maintenance every 30 s as always)
  drains them and keeps running; the file plus WAL is sampled every second until
  60 s after the last job finished (deduplication ids in their window throughout).

Every part uses a fresh SQLite file in a temporary directory. Run the script on an
older commit (e.g. a ``git stash`` or ``git worktree``) for the before figures;
parts that need newer APIs print ``n/a`` there.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

from _common import git_head, machine, percentile, table

from shardq.broker import SqliteBroker
from shardq.broker.base import SendEntry
from shardq.core.errors import ShardqError


def entry(group: str, body: str = "{}") -> SendEntry:
    return SendEntry("0", body, group, uuid.uuid4().hex)


def cycle(broker: SqliteBroker, queue: str) -> float:
    """One send + receive + delete; its duration in seconds."""
    t0 = time.perf_counter()
    broker.send_batch(queue, [entry("g")])
    got = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    broker.delete_batch(queue, [m.receipt for m in got])
    return time.perf_counter() - t0


def fresh_broker(tmp: str, name: str = "broker.db") -> SqliteBroker:
    return SqliteBroker(os.path.join(tmp, name))


# -- a: waiting receives ------------------------------------------------------------


def wait_on(broker: SqliteBroker, stop: threading.Event, queue: str) -> None:
    """Wait in receive on ``queue`` until ``stop`` (as an idle shard's poller does)."""
    while not stop.is_set():
        try:
            broker.receive(queue, max_messages=10, wait_seconds=20, visibility_timeout=30)
        except ShardqError:  # the broker closes at the end
            return


def part_a(rounds: int) -> None:
    rows = []
    for waiting in (8, 200, 1000):
        with tempfile.TemporaryDirectory(prefix="shardq-pressure-") as tmp:
            broker = fresh_broker(tmp)
            broker.ensure_queue("busy.fifo")
            stop = threading.Event()

            threads = []
            for i in range(waiting):
                queue = f"idle-{i}.fifo"
                broker.ensure_queue(queue)
                threads.append(
                    threading.Thread(target=wait_on, args=(broker, stop, queue), daemon=True)
                )
            for thread in threads:
                thread.start()
            time.sleep(1.0 + waiting / 500)  # let them all block in receive
            for _ in range(20):
                cycle(broker, "busy.fifo")  # warm up
            times = [cycle(broker, "busy.fifo") for _ in range(rounds)]
            stop.set()
            broker.wake_waiters()
            broker.close()
            for thread in threads:
                thread.join(5)
        rows.append(
            [
                str(waiting),
                f"{statistics.median(times) * 1000:.2f}",
                f"{percentile(times, 99) * 1000:.2f}",
            ]
        )
    print("\n(a) one send+receive+delete on one queue while other receives wait")
    print(table(["receives waiting", "median ms", "p99 ms"], rows))


# -- b: a blocked entity ----------------------------------------------------------------


def block_entity(broker: SqliteBroker, queue: str, backlog: int) -> None:
    """``backlog`` jobs of one entity, its head received and hidden for 10 minutes."""
    for _ in range(0, backlog, 10):
        broker.send_batch(
            queue,
            [SendEntry(str(i), "{}", "blocked", uuid.uuid4().hex) for i in range(10)],
        )
    (head,) = broker.receive(queue, max_messages=1, wait_seconds=0, visibility_timeout=30)
    broker.change_visibility_batch(queue, [(head.receipt, 600)])


def others_latency(broker: SqliteBroker, seconds: float, busy: Callable[[], None] | None) -> list:
    """Receive latencies of 4 threads cycling over 8 queues, with ``busy`` looping aside."""
    stop = threading.Event()
    latencies: list[float] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        mine: list[float] = []
        n = 0
        while not stop.is_set():
            queue = f"other-{(index + 4 * n) % 8}.fifo"
            n += 1
            broker.send_batch(queue, [entry(f"e{n % 50}")])
            t0 = time.perf_counter()
            got = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
            mine.append(time.perf_counter() - t0)
            if got:
                broker.delete_batch(queue, [m.receipt for m in got])
        with lock:
            latencies.extend(mine)

    def spin() -> None:
        while not stop.is_set():
            busy()  # type: ignore[misc]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    if busy is not None:
        threads.append(threading.Thread(target=spin))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return latencies


def part_b(backlog: int, seconds: float) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardq-pressure-") as tmp:
        broker = fresh_broker(tmp)
        for i in range(8):
            broker.ensure_queue(f"other-{i}.fifo")
        broker.ensure_queue("blocked.fifo")
        base = others_latency(broker, seconds, None)
        block_entity(broker, "blocked.fifo", backlog)

        def receive_blocked() -> None:
            broker.receive("blocked.fifo", max_messages=10, wait_seconds=0, visibility_timeout=30)

        t0 = time.perf_counter()
        for _ in range(50):
            receive_blocked()
        cost = (time.perf_counter() - t0) / 50
        loaded = others_latency(broker, seconds, receive_blocked)
        broker.close()
    for name, values in (("no blocked entity", base), ("with a blocked entity", loaded)):
        rows.append(
            [
                name,
                str(len(values)),
                f"{statistics.median(values) * 1000:.3f}",
                f"{percentile(values, 99) * 1000:.3f}",
            ]
        )
    print(f"\n(b) an entity with {backlog:,} jobs behind a hidden head")
    print(f"receive on its queue: {cost * 1000:.3f} ms each (returns nothing)")
    print(table(["other queues' receives", "count", "p50 ms", "p99 ms"], rows))


# -- c: disk ------------------------------------------------------------------------------


def size_mib(path: str) -> float:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)) / 2**20


def largest_tables(broker: SqliteBroker) -> str:
    """The largest tables and indexes of the broker's file (by SQLite's dbstat) and
    its free pages."""
    db = sqlite3.connect(broker.path)  # its own connection: sees what the broker committed
    try:
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        free *= db.execute("PRAGMA page_size").fetchone()[0]
        try:
            found = db.execute(
                "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 3"
            ).fetchall()
        except sqlite3.Error:  # SQLite built without dbstat
            found = []
    finally:
        db.close()
    return ", ".join(f"{name} {size / 2**20:.2f} MiB" for name, size in [*found, ("free", free)])


def expire_dedup_ids(broker: SqliteBroker) -> None:
    """Let the 5-minute window of every deduplication id sent so far pass: drop the ids
    as the broker's maintenance would 7 minutes from now (:class:`DedupIds` on a clock
    of its own), through a connection of its own; the broker's ``maintain()`` then gives
    their pages back."""
    db = sqlite3.connect(broker.path, isolation_level=None)
    try:
        try:
            from shardq.broker.sqlite_dedup import DedupIds
        except ImportError:  # versions before deduplication buckets: one dedup table
            db.execute("UPDATE dedup SET expires_at = 0")
            return
        later = DedupIds(clock=lambda: time.time() + 7 * 60)
        while True:
            with db:
                db.execute("BEGIN IMMEDIATE")
                if not later.drop_expired(db):
                    break
    finally:
        db.close()


def part_c(jobs: int, short_ids: bool) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardq-pressure-") as tmp:
        path = os.path.join(tmp, "broker.db")
        broker = SqliteBroker(path)
        queues = [f"disk-{i}.fifo" for i in range(8)]
        for queue in queues:
            broker.ensure_queue(queue)
        maintain = getattr(broker, "maintain", None)
        if maintain:
            maintain()
        fresh = size_mib(path)
        rows.append(["fresh", f"{fresh:.2f}"])
        body = '{"v":1,"worker":"Blank","entity":"e","payload":{},"published_at":0,"meta":{}}'
        for b in range(jobs // 10):
            broker.send_batch(
                queues[b % 8],
                [
                    SendEntry(
                        str(i),
                        body,
                        f"e{(b * 10 + i) % 10000}",
                        f"d{b}-{i}" if short_ids else uuid.uuid4().hex,
                    )
                    for i in range(10)
                ],
            )
        rows.append([f"{jobs:,} jobs published", f"{size_mib(path):.2f}"])
        for queue in queues:
            while got := broker.receive(
                queue, max_messages=10, wait_seconds=0, visibility_timeout=60
            ):
                broker.delete_batch(queue, [m.receipt for m in got])
        rows.append(["drained", f"{size_mib(path):.2f}"])
        largest = largest_tables(broker)
        if maintain:
            t0 = time.perf_counter()
            maintain()
            took = time.perf_counter() - t0
            within = size_mib(path)
            ok = "yes" if within <= 3 * fresh + 5 else "NO"
            rows.append(
                [
                    f"maintain() after the drain, ids in their window (<= 3x fresh + 5 MiB: {ok})",
                    f"{within:.2f}",
                ]
            )
            expire_dedup_ids(broker)
            maintain()
            after = size_mib(path)
            ok = "yes" if after <= 3 * fresh + 5 else "NO"
            rows.append(
                [f"maintain() after the window (<= 3x fresh + 5 MiB: {ok})", f"{after:.2f}"]
            )
        else:
            rows.append(["maintain()", "n/a"])
        broker.close()
    ids = "short deduplication ids" if short_ids else "32-character deduplication ids"
    print(f"\n(c) file + WAL, {jobs:,} jobs over 8 queues and 10,000 entities, {ids}")
    print(table(["state", "MiB"], rows))
    print(f"largest after the drain: {largest}")
    if maintain:
        print(f"maintain() right after the drain took {took:.2f} s")


# -- d: node drain ---------------------------------------------------------------------------


def node_drain(shard_count: int, jobs: int, threads: int) -> tuple[float, int]:
    import shardq
    import shardq.ops.logs

    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
    shardq.ops.logs.configure(fmt="json", level="warning", stream=devnull)
    with tempfile.TemporaryDirectory(prefix="shardq-pressure-") as tmp:
        app = shardq.App(shardq.Config(threads=threads), broker=fresh_broker(tmp))
        done = [0]
        lock = threading.Lock()

        class Blank(shardq.Worker):
            shards = shard_count

            def perform(self, entity_id: str, payloads: list) -> None:
                with lock:
                    done[0] += len(payloads)

        app.register(Blank)
        app.ensure_queues()
        Blank.publish_many([(f"entity-{i}", {}) for i in range(jobs)])
        node = app.node(app.plan(threads=threads), until_empty=True, seed=1)
        t0 = time.perf_counter()
        node.run()
        elapsed = time.perf_counter() - t0
        app.broker.close()
    devnull.close()
    return elapsed, done[0]


def part_d(jobs: int, threads: int) -> None:
    rows = []
    for shards in (1000, 8):
        elapsed, done = node_drain(shards, jobs, threads)
        rows.append([str(shards), str(done), f"{elapsed:.2f}", f"{done / elapsed:,.0f}"])
    print(f"\n(d) one node, {threads} threads, {jobs:,} blank jobs over {jobs:,} entities")
    print(table(["shards", "processed", "run s", "jobs/s"], rows))


# -- e: disk under a running node -------------------------------------------------------


def part_e(jobs: int, threads: int = 4, watch: float = 60.0) -> None:
    import shardq
    import shardq.ops.logs

    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
    shardq.ops.logs.configure(fmt="json", level="warning", stream=devnull)
    with tempfile.TemporaryDirectory(prefix="shardq-pressure-") as tmp:
        path = os.path.join(tmp, "broker.db")
        app = shardq.App(shardq.Config(threads=threads), broker=SqliteBroker(path))
        done = [0]
        lock = threading.Lock()

        class Blank(shardq.Worker):
            shards = 8

            def perform(self, entity_id: str, payloads: list[object]) -> None:
                with lock:
                    done[0] += len(payloads)

        app.register(Blank)
        app.ensure_queues()
        app.broker.maintain()
        fresh = size_mib(path)
        for start in range(0, jobs, 10_000):
            Blank.publish_many([(f"e{i % 10_000}", {}) for i in range(start, start + 10_000)])
        published = size_mib(path)
        node = app.node(app.plan(threads=threads), seed=1)
        runner = threading.Thread(target=node.run)
        t0 = time.monotonic()
        runner.start()
        peak, drained_at, samples = published, None, []
        while drained_at is None or time.monotonic() < drained_at + watch:
            time.sleep(1.0)
            size = size_mib(path)
            peak = max(peak, size)
            if drained_at is None and done[0] >= jobs:
                drained_at = time.monotonic()
            if drained_at is not None:
                samples.append((time.monotonic() - drained_at, size))
        node.stop()
        runner.join(30)
        app.broker.close()
    devnull.close()
    bound = 3 * fresh + 5
    within = next((t for t, size in samples if size <= bound), None)
    rows = [
        ["fresh", f"{fresh:.2f}"],
        [f"{jobs:,} jobs published", f"{published:.2f}"],
        ["largest while draining", f"{peak:.2f}"],
        *[[f"{t:.0f} s after the drain", f"{size:.2f}"] for t, size in samples[9::10]],
    ]
    took = (drained_at or t0) - t0
    print(f"\n(e) file + WAL under a running node ({threads} threads), {jobs:,} jobs")
    print(table(["state", "MiB"], rows))
    when = f"{within:.0f} s after the drain" if within is not None else "NOT within the watch"
    print(f"drained in {took:.1f} s; at most 3x fresh + 5 MiB ({bound:.2f} MiB): {when}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a,b,c,d,e", help="comma-separated parts (a-e)")
    parser.add_argument("--rounds", type=int, default=300, help="(a) cycles measured per row")
    parser.add_argument("--backlog", type=int, default=10_000, help="(b) blocked entity's jobs")
    parser.add_argument("--seconds", type=float, default=3.0, help="(b) seconds per row")
    parser.add_argument("--disk-jobs", type=int, default=100_000, help="(c) jobs")
    parser.add_argument(
        "--short-dedup-ids", action="store_true", help="(c) d<batch>-<i> deduplication ids"
    )
    parser.add_argument("--node-jobs", type=int, default=2_000, help="(d) jobs")
    parser.add_argument("--threads", type=int, default=8, help="(d) node threads")
    args = parser.parse_args()
    print(f"shardq embedded broker under pressure  git {git_head()}")
    print(f"machine: {machine()}", flush=True)
    parts = set(args.parts.split(","))
    if "a" in parts:
        part_a(args.rounds)
    if "b" in parts:
        part_b(args.backlog, args.seconds)
    if "c" in parts:
        part_c(args.disk_jobs, args.short_dedup_ids)
    if "d" in parts:
        part_d(args.node_jobs, args.threads)
    if "e" in parts:
        part_e(args.disk_jobs)
    print(f"\nmachine after: {machine()}")


if __name__ == "__main__":
    main()
