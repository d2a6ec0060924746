"""What the elastic fleet costs in state-store requests, and how fast it takes over.

**Cost** (``--scenario cost``, the default): N elastic nodes (threads of this
process, default settings but ``--lease-seconds``) over W workers x S shards, on the
embedded broker, with a state store that counts every call and the bytes each query
returns. Once every shard is owned, the counts are taken over ``--seconds``. It
prints requests per node-hour and per shard-hour, and DynamoDB's on-demand read and
write units for them (a strongly consistent query costs one read unit per 4 KB of
items returned, rounded up per query; a put one write unit per 1 KB of item), and
the monthly cost of a fleet of that size at ``--read-price`` / ``--write-price``
dollars per million units (us-east-1 on-demand list prices by default).

    python bench/fleet_cost.py --nodes 3 --workers 1 --shards 64 --seconds 60

**Times** (``--scenario times``): ``--runs`` times, 3 nodes over 6 shards with
``--lease-seconds`` (default 10): one node (an app of its own over the same store) is
cut off from the state store as by kill -9 (no more heartbeats, nothing released:
every store call of it fails) and the time until the others own all its shards is
measured; then one node stops gracefully and the same is measured. On
``--broker sqlite`` (a file in a temporary directory) or ``--broker sqs`` (a
ministack process started here on 127.0.0.1, stopped by its pid).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from shardq import App, Worker  # noqa: E402
from shardq.broker import Broker, SqliteBroker  # noqa: E402
from shardq.core.config import Config  # noqa: E402
from shardq.core.fleet_rules import ELASTIC  # noqa: E402
from shardq.core.plan import Plan  # noqa: E402
from shardq.run.node import Node  # noqa: E402
from shardq.store import Item, MemoryStore, Store, StoreError  # noqa: E402
from shardq.store.base import encode  # noqa: E402


class CountingStore(Store):
    """A store that counts calls, and read/write units as DynamoDB would bill them."""

    kind = "counting"

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.read_units = 0
        self.write_units = 0
        self._lock = threading.Lock()

    def _count(self, call: str, reads: int = 0, writes: int = 0) -> None:
        with self._lock:
            self.calls[call] += 1
            self.read_units += reads
            self.write_units += writes

    def get(self, key: str) -> Item | None:
        item = self.inner.get(key)
        self._count("get", reads=_units(item, 4096))
        return item

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        size = len(encode(value)) + len(key) + 16
        try:
            return self.inner.put(key, value, version=version)
        finally:
            self._count("put " + key.partition("/")[0], writes=max(1, math.ceil(size / 1024)))

    def delete(self, key: str, *, version: int | None = None) -> bool:
        try:
            return self.inner.delete(key, version=version)
        finally:
            self._count("delete " + key.partition("/")[0], writes=1)

    def query(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int = 1000,
        keep_damaged: bool = False,
    ) -> list[Item]:
        items = self.inner.query(
            prefix, start_after=start_after, limit=limit, keep_damaged=keep_damaged
        )
        size = sum(len(encode(i.value)) + len(i.key) + 16 for i in items)
        self._count("query " + prefix, reads=max(1, math.ceil(size / 4096)))
        return items

    def query_all(self, prefix: str, *, keep_damaged: bool = False) -> list[Item]:
        """As DynamoStore reads them: one request per page of 1 MB."""
        items = self.inner.query_all(prefix, keep_damaged=keep_damaged)
        size = sum(len(encode(i.value)) + len(i.key) + 16 for i in items)
        for page in range(max(1, math.ceil(size / 2**20))):
            left = min(2**20, size - page * 2**20)
            self._count("query " + prefix, reads=max(1, math.ceil(left / 4096)))
        return items

    def snapshot(self) -> tuple[Counter[str], int, int]:
        with self._lock:
            return Counter(self.calls), self.read_units, self.write_units


class Severable(Store):
    """A store that fails every call once :meth:`sever` was called: the node using it
    writes nothing more, as if it had been killed with kill -9."""

    kind = "severable"

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.severed = threading.Event()

    def sever(self) -> None:
        self.severed.set()

    def _check(self) -> None:
        if self.severed.is_set():
            raise StoreError("severed: this node is gone")

    def get(self, key: str) -> Item | None:
        self._check()
        return self.inner.get(key)

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        self._check()
        return self.inner.put(key, value, version=version)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        self._check()
        return self.inner.delete(key, version=version)

    def query(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int = 1000,
        keep_damaged: bool = False,
    ) -> list[Item]:
        self._check()
        return self.inner.query(
            prefix, start_after=start_after, limit=limit, keep_damaged=keep_damaged
        )


def _units(item: Item | None, per: int) -> int:
    return 1 if item is None else max(1, math.ceil((len(encode(item.value)) + 16) / per))


def make_app(
    workers: int, shards: int, lease: float, broker: Broker, store: Store, prefix: str = ""
) -> App:
    prefix = prefix or f"fc{time.monotonic_ns() % 10**8}-"
    app = App(
        Config(queue_prefix=prefix, lease_seconds=lease),
        broker=broker,
        store=store,
    )
    for w in range(workers):
        app.register(type(f"Bench{w}", (Worker,), {"shards": shards, "perform": _noop}))
    return app


def _noop(self: Worker, entity_id: str, payloads: list[Any]) -> None:
    return None


@contextmanager
def fleet(apps: list[App]) -> Iterator[list[tuple[Node, threading.Thread]]]:
    """A node of each app in ``apps``, each in a thread of its own."""
    running: list[tuple[Node, threading.Thread]] = []
    try:
        for app in apps:
            node = app.node(Plan(0, 0, ()), threads=2, membership=ELASTIC)
            thread = threading.Thread(target=node.run, daemon=True)
            thread.start()
            running.append((node, thread))
        yield running
    finally:
        for node, _ in running:
            node.stop()
        for _, thread in running:
            thread.join(30)


def owners(store: Store) -> dict[str, str]:
    items = store.query_all("shard/")
    return {i.key.partition("/")[2]: str(i.value["owner"]) for i in items if i.value["owner"]}


def wait(check: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - start


def balanced(store: Store, ids: set[str], total: int) -> bool:
    held = owners(store)
    counts = Counter(held.values())
    return (
        len(held) == total
        and set(counts) == ids
        and max(counts.values()) - min(counts.values()) <= 1
    )


def cost(args: argparse.Namespace) -> None:
    store = CountingStore(MemoryStore())
    total = args.workers * args.shards
    with tempfile.TemporaryDirectory() as tmp:
        broker = SqliteBroker(str(Path(tmp) / "b.db"))
        app = make_app(args.workers, args.shards, args.lease_seconds, broker, store)
        with fleet([app] * args.nodes) as nodes:
            ids = {n.id for n, _ in nodes}
            wait(lambda: balanced(store.inner, ids, total), 120)
            time.sleep(args.lease_seconds)
            calls0, r0, w0 = store.snapshot()
            time.sleep(args.seconds)
            calls1, r1, w1 = store.snapshot()
        broker.close()
    hours = args.seconds / 3600
    node_hours = args.nodes * hours
    calls = calls1 - calls0
    requests = sum(calls.values())
    print(
        f"{args.nodes} nodes x {total} shards, lease_seconds {args.lease_seconds:g}, "
        f"{args.seconds:g} s measured"
    )
    for call, n in sorted(calls.items()):
        print(f"  {call:<16} {n / node_hours:>10,.0f} per node-hour")
    per_node = requests / node_hours
    reads, writes = (r1 - r0) / node_hours, (w1 - w0) / node_hours
    per_shard = sum(n for c, n in calls.items() if c.endswith(" shard")) / (total * hours)
    print(
        f"  requests         {per_node:>10,.0f} per node-hour; {per_shard:,.2f} per "
        "shard-hour (ownership writes, only when a shard changes hands)"
    )
    print(f"  read units       {reads:>10,.0f} per node-hour; write units {writes:,.0f}")
    month = 730 * args.nodes
    dollars = month * (reads * args.read_price + writes * args.write_price) / 1e6
    print(
        f"  DynamoDB on-demand for this fleet: ${dollars:.2f} per month "
        f"({args.read_price:g} $/M reads, {args.write_price:g} $/M writes)"
    )


def times(args: argparse.Namespace) -> None:
    kills: list[float] = []
    leaves: list[float] = []
    emulator: Any = None
    try:
        if args.broker == "sqs":
            import os

            from tests import emulator as emu

            os.environ.update(
                AWS_ACCESS_KEY_ID="test",
                AWS_SECRET_ACCESS_KEY="test",
                AWS_DEFAULT_REGION="us-east-1",
            )
            emulator = emu.start()
        for run in range(args.runs):
            kill, leave = one_run(args, emulator)
            kills.append(kill)
            leaves.append(leave)
            print(f"run {run + 1}: takeover after a kill {kill:.2f} s, after a leave {leave:.2f} s")
    finally:
        if emulator is not None:
            from tests import emulator as emu

            emu.stop(emulator)
    for name, got in (("kill -9 takeover", kills), ("graceful leave", leaves)):
        print(
            f"{args.broker}: {name}: p50 {statistics.median(got):.2f} s, "
            f"max {max(got):.2f} s over {len(got)} runs (lease_seconds {args.lease_seconds:g})"
        )


def one_run(args: argparse.Namespace, emulator: Any) -> tuple[float, float]:
    store = MemoryStore()
    with tempfile.TemporaryDirectory() as tmp:
        broker: Broker
        if emulator is None:
            broker = SqliteBroker(str(Path(tmp) / "b.db"))
        else:
            from shardq.broker.sqs import SqsBroker

            broker = SqsBroker(region="us-east-1", endpoint_url=emulator.endpoint_url)
        app = make_app(1, 6, args.lease_seconds, broker, store)
        severable = Severable(store)
        prefix = app.config.queue_prefix
        cut_off = make_app(1, 6, args.lease_seconds, broker, severable, prefix)
        with fleet([cut_off, app, app]) as nodes:
            ids = {n.id for n, _ in nodes}
            wait(lambda: balanced(store, ids, 6), 120)
            victim = nodes[0][0]
            severable.sever()  # as kill -9: no beat, no release
            kill = wait(lambda: balanced(store, ids - {victim.id}, 6), 120)
            leaver = nodes[1][0]
            start = time.monotonic()
            leaver.stop()
            wait(lambda: balanced(store, ids - {victim.id, leaver.id}, 6), 120)
            leave = time.monotonic() - start
        broker.close()
    return kill, leave


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("cost", "times"), default="cost")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--lease-seconds", type=float, default=None)
    parser.add_argument("--read-price", type=float, default=0.125)
    parser.add_argument("--write-price", type=float, default=0.625)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--broker", choices=("sqlite", "sqs"), default="sqlite")
    args = parser.parse_args()
    if args.lease_seconds is None:
        args.lease_seconds = 30.0 if args.scenario == "cost" else 10.0
    (cost if args.scenario == "cost" else times)(args)


if __name__ == "__main__":
    main()
