"""Takeover, leave and join times of an elastic fleet of real ``shardq run`` processes.

Each run, on a fresh app (new queue prefix; on ``--broker sqlite`` a new broker file,
on ``--broker sqs`` one ministack on 127.0.0.1 shared by the runs, stopped by its pid
at the end), with a job of each of ``--per-shard`` entities of every shard published
every ``--publish-every`` s:

1. **join**: two elastic nodes (``shardq run`` without ``--node``) of the ledger app
   (``tests/apps/ledger.py``) start; once they share the shards, a third one starts.
   Timed from its start (``Popen``) and from its heartbeat's first appearance in the
   state store until every node holds within one of the fair share of ``--shards``;
2. **kill**: the node holding the most shards gets SIGKILL. Timed until every shard
   it held has a job *started* by another process (the ledger), and until the store
   names another owner for each;
3. **leave**: once the two survivors are balanced, the one holding the most gets
   SIGTERM (it must exit 0). Timed the same way;
4. publishing stops; the last node drains the queues; the ledger is checked (every
   job ran, first successes in publish order, no entity run twice at once; a job
   replayed after the kill is allowed, and counted).

Per run, a departure's figure is the time until *all* its shards were served again
(the slowest shard). It prints p50 and max over the runs with the lease settings.

    python bench/takeover.py --broker sqlite --runs 5
    python bench/takeover.py --broker sqs --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT, git_head, machine

from shardq.core.config import Config
from shardq.core.topology import shard_for
from tests import emulator as emu
from tests.apps import ledger

WORKER = "Ledgered"
#: Seconds between two looks at the store's owners (each reads every shard's item): 50
#: ms, longer with many shards; the ledger is looked at every 50 ms.
POLL = [0.05]
#: Seconds a step may take before the run fails: 120, longer with many shards.
LIMIT = [120.0]


class Publisher(threading.Thread):
    """Publishes job ``n`` of every entity, ``n`` = 0, 1, ..., every ``every`` s."""

    def __init__(self, entities: list[str], every: float) -> None:
        super().__init__(daemon=True)
        self.entities, self.every = entities, every
        self.rounds = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                ledger.Ledgered.publish_many(
                    [(e, {"n": self.rounds, "sleep": 0.005}) for e in self.entities]
                )
                self.rounds += 1
                self.halt.wait(self.every)
        except BaseException as exc:  # reported by the driver
            self.error = exc


def entities_for(shards: int, per_shard: int) -> list[str]:
    """``per_shard`` entity names in each shard."""
    found: dict[int, list[str]] = {s: [] for s in range(shards)}
    i = 0
    while any(len(v) < per_shard for v in found.values()):
        name = f"e{i}"
        bucket = found[shard_for(name, shards)]
        if len(bucket) < per_shard:
            bucket.append(name)
        i += 1
    return [name for names in found.values() for name in names]


def pid_of(node_id: str) -> int:
    """The pid inside a node id ``host-pid-xxxx``."""
    return int(node_id.rsplit("-", 2)[1])


def owners() -> dict[int, int]:
    """shard -> pid of its owner, for the shards someone owns."""
    out = {}
    for item in ledger.app.store.query_all("shard/"):
        owner = str(item.value.get("owner", "") or "")
        key = item.key.partition("/")[2]
        if owner and key.startswith(f"{WORKER}:"):
            out[int(key.rpartition(":")[2])] = pid_of(owner)
    return out


def beating() -> set[int]:
    """Pids of the nodes with a heartbeat item not marked gone."""
    return {
        pid_of(item.key.partition("/")[2])
        for item in ledger.app.store.query_all("node/")
        if not item.value.get("gone")
    }


def balanced(pids: set[int], shards: int) -> bool:
    held = owners()
    counts = Counter(held.values())
    fair = shards / len(pids)
    return (
        len(held) == shards
        and set(counts) == pids
        and all(fair - 1 < n < fair + 1 for n in counts.values())
    )


def wait(check: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> float:
    """Polls ``check`` every ``every`` s; returns ``time.time()`` when it first held."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return time.time()


class Tail:
    """The ledger's entries as the nodes append them: whole lines, each read once (a
    re-read of the whole file at every poll loads the machine the nodes run on)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.entries = path, 0, []

    def read(self) -> list[dict[str, Any]]:
        """The entries appended since the last read (all are in ``entries``)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(whole)
        new = [json.loads(line) for line in whole.splitlines() if line.strip()]
        self.entries += new
        return new


def said(out: dict[str, Any]) -> None:
    """Print what a run measured so far (a later step that fails loses nothing)."""
    print("  so far: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()), flush=True)


def departure(
    node: subprocess.Popen[bytes], sig: int, shards: int, tail: Tail
) -> tuple[float, float, int]:
    """Send ``sig`` to ``node``; (seconds until every shard it held was served by
    another process, seconds until another node owned each, shards it held)."""
    held = {s for s, pid in owners().items() if pid == node.pid}
    os.kill(node.pid, sig)
    t0 = time.time()

    def moved() -> bool:  # one read of the owners a poll (it read them once per shard)
        now = owners()
        return all(now.get(s, node.pid) != node.pid for s in held)

    owned_at = wait(moved, LIMIT[0], "new owners", POLL[0])
    served: dict[int, float] = {}

    def all_served() -> bool:  # the first start by another process after the signal
        for e in tail.read():
            if e["event"] == "start" and e["t"] > t0 and e["pid"] != node.pid:
                shard = shard_for(e["entity"], shards)
                served[shard] = min(served.get(shard, e["t"]), e["t"])
        return held <= set(served)

    wait(all_served, LIMIT[0], "the shards to be served")
    slowest = max((served[s] for s in held), default=t0)
    return slowest - t0, owned_at - t0, len(held)


def one_run(args: argparse.Namespace, env: dict[str, str], work: Path) -> dict[str, Any]:
    env = {
        **env,
        "SHARDQ_QUEUE_PREFIX": f"tk{uuid.uuid4().hex[:6]}-",
        "SHARDQ_APP": "tests.apps.ledger",
        "SHARDQ_LEASE_SECONDS": str(args.lease_seconds),
        "SHARDQ_IDLE_WAIT_SECONDS": "1",
        "SHARDQ_GRACE_SECONDS": "20",
        "SHARDQ_LOG_FORMAT": "json",
        f"SHARDQ_WORKERS__{WORKER}__shards": str(args.shards),
        "LEDGER_PATH": str(work / "ledger.jsonl"),
    }
    ledger.app.configure(Config.load(env={k: v for k, v in env.items() if "SHARDQ_" in k}))
    ledger.app.ensure_queues()
    child_env = {**os.environ, **env}
    nodes: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = open(work / f"node{len(nodes)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardq", "run"],
            cwd=ROOT,
            env=child_env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        nodes.append(proc)
        return proc

    entities = entities_for(args.shards, args.per_shard)
    publisher = Publisher(entities, args.publish_every)
    out: dict[str, Any] = {}
    try:
        first = {start().pid, start().pid}
        publisher.start()
        wait(lambda: balanced(first, args.shards), LIMIT[0], "two nodes to share", POLL[0])
        spawned = time.time()
        third = start()
        joined = wait(lambda: third.pid in beating(), LIMIT[0], "the third node's heartbeat")
        three = first | {third.pid}
        done = wait(lambda: balanced(three, args.shards), LIMIT[0], "balance", POLL[0])
        out["join_from_start"], out["join_from_beat"] = done - spawned, done - joined
        said(out)
        path = Path(env["LEDGER_PATH"])
        tail = Tail(path)
        by_count = Counter(owners().values())
        victim = next(p for p in nodes if p.pid == by_count.most_common(1)[0][0])
        out["kill_served"], out["kill_owned"], out["kill_held"] = departure(
            victim, signal.SIGKILL, args.shards, tail
        )
        killed_at = time.time() - out["kill_served"]
        said(out)
        victim.wait()
        alive = {p.pid for p in nodes if p.poll() is None}
        wait(lambda: balanced(alive, args.shards), LIMIT[0], "the survivors to balance", POLL[0])
        by_count = Counter(owners().values())
        leaver = next(p for p in nodes if p.pid == by_count.most_common(1)[0][0])
        out["leave_served"], out["leave_owned"], out["leave_held"] = departure(
            leaver, signal.SIGTERM, args.shards, tail
        )
        out["leave_exit"] = leaver.wait(30)
        said(out)
        publisher.halt.set()
        publisher.join(30)
        if publisher.error is not None:
            raise publisher.error
        expected = dict.fromkeys(entities, publisher.rounds)

        ended = {(e["entity"], e["n"]) for e in tail.entries if e["event"] == "end"}

        def drained() -> bool:
            ended.update((e["entity"], e["n"]) for e in tail.read() if e["event"] == "end")
            return len(ended) >= len(entities) * publisher.rounds

        wait(drained, LIMIT[0], "the last node to drain the queues")
        tail.read()
        problems = ledger.check(tail.entries, expected, killed={victim.pid: killed_at})
        out["jobs"] = len(entities) * publisher.rounds
        out["duplicates"] = len(problems.pop("duplicates"))  # a replay after the kill: allowed
        out["problems"] = {k: len(v) for k, v in problems.items() if v}
    finally:
        publisher.halt.set()
        for proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in nodes:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("sqlite", "sqs"), default="sqlite")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shards", type=int, default=8, help="shards of the worker (8)")
    parser.add_argument("--lease-seconds", type=int, default=10, help="(10, the least)")
    parser.add_argument("--publish-every", type=float, default=0.2)
    parser.add_argument("--per-shard", type=int, default=4, help="entities per shard (4)")
    parser.add_argument("--keep", action="store_true", help="keep the logs and ledgers")
    args = parser.parse_args()
    POLL[0], LIMIT[0] = max(0.05, args.shards / 2000), max(120.0, args.shards * 0.6)
    print(f"# {machine()}  git={git_head()}", flush=True)
    print(f"# python bench/takeover.py {' '.join(sys.argv[1:])}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="shardq-takeover-"))
    server = None
    results = []
    try:
        env: dict[str, str] = {}
        if args.broker == "sqs":
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                os.environ.setdefault(key, "test")  # ministack takes any
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            server = emu.start()
            env = {
                "SHARDQ_BROKER_URL": "sqs://",
                "SHARDQ_ENDPOINT_URL": server.endpoint_url,
                "SHARDQ_REGION": "us-east-1",
            }
        for run in range(args.runs):
            work = root / f"run{run + 1}"
            work.mkdir()
            if args.broker == "sqlite":
                env = {"SHARDQ_BROKER_URL": f"sqlite:///{work / 'broker.db'}"}
            got = one_run(args, env, work)
            results.append(got)
            print(
                f"run {run + 1}: join {got['join_from_beat']:.2f} s after its heartbeat "
                f"({got['join_from_start']:.2f} s after its start); kill -9 of a node holding "
                f"{got['kill_held']}: served {got['kill_served']:.2f} s (owned "
                f"{got['kill_owned']:.2f} s); SIGTERM of a node holding {got['leave_held']}: "
                f"served {got['leave_served']:.2f} s (owned {got['leave_owned']:.2f} s), exit "
                f"{got['leave_exit']}; {got['jobs']} jobs, {got['duplicates']} replayed after "
                "the kill, "
                f"problems {got['problems'] or 'none'}; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    finally:
        if server is not None:
            emu.stop(server)
    print(f"# {machine()}")
    print(f"{args.broker}, {args.shards} shards, lease_seconds {args.lease_seconds}, 3 nodes:")
    for key, name in (
        ("kill_served", "kill -9, until every shard it held ran a job elsewhere"),
        ("kill_owned", "kill -9, until another node owned each"),
        ("leave_served", "SIGTERM, until every shard it held ran a job elsewhere"),
        ("leave_owned", "SIGTERM, until another node owned each"),
        ("join_from_beat", "join, from its heartbeat to balance within one of fair share"),
        ("join_from_start", "join, from its process start to balance"),
    ):
        got = [r[key] for r in results]
        print(f"  {name}: p50 {statistics.median(got):.2f} s, max {max(got):.2f} s")
    bad = [r["problems"] for r in results if r["problems"]]
    replays = [r["duplicates"] for r in results]
    exits = [r["leave_exit"] for r in results]
    print(
        f"  ledger problems: {bad or 'none'} (jobs replayed after the kill: {replays}); "
        f"exit codes after SIGTERM: {exits}"
    )
    if not args.keep and not bad:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    else:
        print(f"# kept: {root}")
    return 1 if bad or any(exits) else 0


if __name__ == "__main__":
    sys.exit(main())
