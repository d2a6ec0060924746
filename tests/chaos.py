"""The chaos driver: node processes killed at random while numbered jobs flow, then a proof.

Used by ``tests/test_chaos.py`` (small, in CI) and ``bench/chaos.py`` (large, by hand).

A run:

1. starts ``nodes`` ``shardq run`` child processes of the ledger app
   (``tests.apps.ledger``) over the same shards, laid out by ``layout``:

   * ``mixed`` (default): ``nodes - 1`` processes split the shards as a deployment
     would (``--node k --nodes nodes-1``) and one more process owns every shard, as if
     started with the wrong ``--nodes`` by mistake. Every shard is served by two
     processes at once, so the broker's group lock (not the plan) is what keeps an
     entity from running twice, and a killed node's jobs are picked up both by its
     restarted self and by the other owner;
   * ``overlap``: every process owns every shard (the most contention);
   * ``split``: the plain deployment, each shard served by one process;
   * ``elastic``: ``shardq run`` without ``--node``: the processes form a fleet that
     shares the shards by leases (lease timeout ``lease_seconds``, rebalance every
     ``report_seconds``). Instead of kill-and-restart, every ``event_every`` seconds
     one event (the first a kill, the others at random): a node killed with SIGKILL
     (not restarted), a new node
     started (it joins), or a node stopped with SIGTERM (it must exit 0), keeping
     between 1 and ``max_nodes`` nodes alive; the node killed or stopped is one that
     ran a job in the last ``BUSY_SECONDS`` (any, if none did). From the ledger and the nodes' logs,
     :mod:`tests.takeover` measures how long each dead node's shards waited for
     another process, which must be at most ``lease_seconds`` + 10 s;

2. publishes ``entities`` x ``jobs`` numbered jobs from this process, in bursts of
   ``burst`` consecutive jobs of one entity (so a receive of 10 often holds several
   jobs of one entity and the failure rule of the executor is exercised), spread over
   the first ``publish_share`` of the kill phase. ``fail_rate`` of all attempts fail at
   random (a retry follows); a ``permanent`` share of jobs always fails with
   ``PermanentError`` and must end in the morgue. Each job has a dedup id, so a
   publish that failed (broker outage) is simply sent again;
3. for ``duration`` seconds, every ``kill_every`` seconds (uniform in the range)
   SIGKILLs a random node process and starts it again at once (elastic layout: one
   kill, join or stop every ``event_every`` seconds, see above). Optionally the
   broker is stopped for ``outage_seconds`` at ``outage_at`` (the caller gives how);
4. waits until every shard queue is empty (published jobs all deleted), stops the
   nodes with SIGTERM (each must exit 0, as must every node stopped during the run),
   reads the morgue and the ledger and checks with :func:`tests.apps.ledger.check`,
   a killed process's unfinished executions counting as running until the moment it
   was known dead; in the elastic layout, also the takeover times.

With ``reshards`` (elastic layout), the random events give way to reshards of the
worker by ``shardq reshard`` child processes, a node killed during each
(:mod:`tests.chaos_reshard`); the drain then covers every generation of the live
layout, and the old generations' queues, the final layout and the commands are
checked too. With ``publisher="process"`` the jobs are published by a child process
(:mod:`tests.chaos_publisher`) instead of a thread of the driver.

Every process started here is stopped by its pid, also when the run fails.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from shardq import morgue
from shardq.core.config import Config
from shardq.core.errors import QueueNotFoundError, ShardqError
from shardq.core.topology import shard_for
from shardq.publish import Job
from tests import chaos_reshard
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.chaos_reshard import PublisherProcess, Refusal, Reshard
from tests.children import wait_catching
from tests.takeover import (
    HANDOVER,
    KILL,
    STOP,
    Departure,
    Holds,
    Takeover,
    figures,
    measure,
    read_log,
)

ROOT = Path(__file__).resolve().parent.parent
WORKER = "Ledgered"
LAYOUTS = ("mixed", "overlap", "split", "elastic")
#: A dead node's shards must be served again within its lease timeout plus this.
TAKEOVER_SLACK = 10.0
#: Elastic layout: seconds a node runs at least before it may be stopped with SIGTERM.
MIN_AGE = 5.0
#: Elastic layout: a node is killed or stopped at random among those that started a
#: job in the last BUSY_SECONDS (among all if none did), so events hit serving nodes.
BUSY_SECONDS = 2.0
#: Seconds around a broker outage within which a job's first success may repeat.
OUTAGE_MARGIN = 5.0
#: Seconds the outage (past ``outage_at``), the elastic events or the reshards (past the
#: start) wait at most for every node to serve.
READY_SECONDS = 30.0
#: Events a node logs when a broker call failed (after boto3's own retries).
BROKER_TROUBLE = {
    "node.receive_failed",
    "node.watch_failed",
    "lease.request_failed",
    "lease.lost",
    "lease.change_failed",
    "lease.release_failed",
    "job.delete_failed",
    "job.morgue_failed",
    "job.lapsed",
}
#: Events a node logs when a part of it died or misbehaved.
CRASHES = {
    "node.part_failed",
    "observer.failed",
    "job.retry_in_failed",
}


@dataclass(frozen=True)
class Settings:
    """What a chaos run does; the defaults are the CI size."""

    nodes: int = 3
    layout: str = "mixed"
    threads: int = 2
    #: Each node's ``concurrency`` (jobs at once, over its shards): above 1, so entities
    #: of one shard run at once and order rests on the entity chains.
    concurrency: int = 8
    shards: int = 4
    entities: int = 150
    jobs: int = 10
    burst: int = 5
    fail_rate: float = 0.1
    permanent: float = 0.02
    sleep: float = 0.0
    duration: float = 25.0
    #: Seconds between kills (uniform); None: no kills.
    kill_every: tuple[float, float] | None = (1.0, 3.0)
    publish_share: float = 0.8
    visibility_timeout: int = 2
    #: Seconds into the kill phase at which the broker goes away (None: no outage).
    outage_at: float | None = None
    outage_seconds: float = 10.0
    drain_timeout: float = 150.0
    seed: int = 1
    #: Elastic layout: nodes alive at most, seconds between events (uniform), and the
    #: fleet's lease timeout and report interval.
    max_nodes: int = 4
    event_every: tuple[float, float] = (3.0, 6.0)
    lease_seconds: int = 10
    report_seconds: int = 5
    #: "thread": the driver publishes; "process": a child process does
    #: (:mod:`tests.chaos_publisher`), reading the layout on its own.
    publisher: str = "thread"
    #: Elastic layout: reshards of the worker, each (seconds into the run, new number of
    #: shards), each by a ``shardq reshard`` child process once every node serves and
    #: the reshard before it ended; they replace the random events (see
    #: :mod:`tests.chaos_reshard`). ``reshard_kill``: during each, a busy
    #: node gets SIGKILL ``reshard_kill_after`` s after it began and a new one joins.
    reshards: tuple[tuple[float, int], ...] = ()
    reshard_kill: bool = True
    reshard_kill_after: float = 2.0
    #: Indexes into ``reshards`` whose command gets SIGKILL as soon as it began.
    kill_reshard_command: tuple[int, ...] = ()
    #: SHARDQ_LAYOUT_REFRESH_SECONDS and SHARDQ_RESHARD_TRUST_SECONDS of a reshard run.
    layout_refresh_seconds: float = 0.5
    reshard_trust_seconds: float = 6.0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {self.layout!r}")
        if self.layout == "mixed" and self.nodes < 2:
            raise ValueError("the mixed layout needs at least 2 nodes")
        if self.nodes < 1 or self.entities < 1 or self.jobs < 1 or self.burst < 1:
            raise ValueError("nodes, entities, jobs and burst must be at least 1")
        if self.layout == "elastic" and self.nodes > self.max_nodes:
            raise ValueError(f"nodes ({self.nodes}) must not exceed max_nodes")
        if self.layout == "elastic" and self.outage_at is not None:
            raise ValueError("the elastic layout has no broker outage")
        if self.publisher not in ("thread", "process"):
            raise ValueError(f"publisher must be thread or process, not {self.publisher!r}")
        if self.reshards and not self.elastic:
            raise ValueError("reshards need the elastic layout")
        times = [at for at, _ in self.reshards]
        if times != sorted(times) or any(at < 0 for at in times):
            raise ValueError(f"reshard times must be >= 0 and in order, got {times}")
        if any(not 0 <= i < len(self.reshards) for i in self.kill_reshard_command):
            raise ValueError("kill_reshard_command must index reshards")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        """Settings from ``dataclasses.asdict`` through JSON (lists back to tuples)."""

        def tupled(value: Any) -> Any:
            return tuple(tupled(v) for v in value) if isinstance(value, list) else value

        return cls(**{k: tupled(v) for k, v in data.items()})

    @property
    def publish_window(self) -> float:
        """Seconds over which the jobs are published."""
        return self.duration * self.publish_share

    @property
    def elastic(self) -> bool:
        return self.layout == "elastic"

    @property
    def takeover_bound(self) -> float:
        """Seconds within which a dead node's shards must be served again."""
        return self.lease_seconds + TAKEOVER_SLACK


@dataclass
class Outage:
    """How to take the broker away and bring it back (on the same address)."""

    stop: Callable[[], None]
    start: Callable[[], None]


@dataclass
class Report:
    """What a chaos run did and what the checker found."""

    settings: Settings
    broker: str
    published: int = 0
    permanent: int = 0
    executions: int = 0
    failed_attempts: int = 0
    kills: int = 0
    killed: dict[int, float] = field(default_factory=dict)
    #: Elastic layout: nodes started during the run, nodes stopped with SIGTERM (and
    #: their exit codes), every death in order, and the takeovers measured.
    joins: int = 0
    stops: int = 0
    stop_codes: list[int] = field(default_factory=list)
    deaths: list[Departure] = field(default_factory=list)
    takeovers: list[Takeover] = field(default_factory=list)
    alive_at_end: int = 0
    node_processes: int = 0
    duplicates: int = 0
    morgued: int = 0
    morgue_reasons: dict[str, int] = field(default_factory=dict)
    publish_retries: int = 0
    #: Warnings and errors the nodes logged, by event.
    log_events: dict[str, int] = field(default_factory=dict)
    outage: tuple[float, float] | None = None
    outage_wall: tuple[float, float] | None = None
    outage_duplicates: int = 0
    interrupted: int = 0
    exit_codes: list[int] = field(default_factory=list)
    wall_seconds: float = 0.0
    drain_seconds: float = 0.0
    problems: dict[str, list[Any]] = field(default_factory=dict)
    log_dir: str = ""
    #: Reshard runs: each reshard, the second command's refusal, every queue of an old
    #: generation at the end (jobs held; None: deleted) and the layout at the end.
    reshards: list[Reshard] = field(default_factory=list)
    refusal: Refusal | None = None
    old_queues: dict[str, int | None] = field(default_factory=dict)
    final_layout: dict[str, Any] = field(default_factory=dict)

    @property
    def broker_trouble(self) -> int:
        """Broker failures the nodes logged."""
        return sum(n for event, n in self.log_events.items() if event in BROKER_TROUBLE)

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    @property
    def safe(self) -> bool:
        """No problem but slow takeovers (a liveness bound: nothing lost or reordered)."""
        return not any(v for kind, v in self.problems.items() if kind != "slow_takeover")

    def summary(self) -> str:
        s = self.settings
        lines = [
            f"broker={self.broker} nodes={s.nodes} ({s.layout}) threads={s.threads} "
            f"concurrency={s.concurrency} "
            f"shards={s.shards} entities={s.entities} jobs/entity={s.jobs} "
            f"fail_rate={s.fail_rate} permanent={s.permanent} duration={s.duration:g}s "
            + ("" if s.elastic else f"kill_every={s.kill_every} ")
            + f"seed={s.seed}",
            f"jobs published: {self.published} ({self.permanent} permanent failures)",
            f"executions: {self.executions} ({self.failed_attempts} failed attempts)",
            *self._events(),
            f"duplicates: {self.duplicates} (jobs that succeeded twice; "
            f"{self.duplicates - self.outage_duplicates} first run on a killed node, "
            f"{self.outage_duplicates} around the outage)",
            f"interrupted: {self.interrupted} executions cut short by a kill",
            f"morgued: {self.morgued} {dict(sorted(self.morgue_reasons.items()))}",
            f"publish retries: {self.publish_retries}",
            f"node warnings/errors: {dict(sorted(self.log_events.items()))}",
        ]
        if self.outage:
            lines.append(
                f"broker outage: {self.outage[1] - self.outage[0]:.1f} s, "
                f"from {self.outage[0]:.1f} s into the run; "
                f"{self.outage_duplicates} duplicates first run within "
                f"{OUTAGE_MARGIN:g} s of it"
            )
        lines += [
            f"node exit codes at the end (SIGTERM): {self.exit_codes}",
            f"wall time: {self.wall_seconds:.1f} s (drain after the last kill: "
            f"{self.drain_seconds:.1f} s)",
            "problems: "
            + ", ".join(f"{k}={len(v)}" for k, v in self.problems.items())
            + ("  -> PASS" if self.ok else "  -> FAIL"),
        ]
        return "\n".join(lines)

    def _events(self) -> list[str]:
        if self.settings.reshards:
            return self._reshard_lines()
        if not self.settings.elastic:
            return [f"kills: {self.kills} (SIGKILL; {self.node_processes} node processes in all)"]
        s = self.settings
        return [
            f"fleet: lease_seconds={s.lease_seconds} report_seconds={s.report_seconds} "
            f"nodes {s.nodes} at the start, 1..{s.max_nodes} alive, an event every "
            f"{s.event_every[0]:g}-{s.event_every[1]:g} s",
            f"events: {self.kills} killed (SIGKILL, not restarted), {self.joins} joined, "
            f"{self.stops} stopped (SIGTERM, exit codes {self.stop_codes}); "
            f"{self.node_processes} node processes in all, {self.alive_at_end} at the end",
            f"takeover after a kill: {figures(self.takeovers, KILL).text()}",
            f"takeover after a graceful stop: {figures(self.takeovers, STOP).text()}",
            f"handover on a rebalance (not judged): {figures(self.takeovers, HANDOVER).text()}",
            f"(every takeover must be within lease_seconds + {TAKEOVER_SLACK:g} = "
            f"{s.takeover_bound:g} s)",
        ]

    def _reshard_lines(self) -> list[str]:
        s = self.settings
        lines = [
            f"fleet: lease_seconds={s.lease_seconds} report_seconds={s.report_seconds}, "
            f"{s.nodes} elastic nodes; layout refresh {s.layout_refresh_seconds:g} s, "
            f"reshard trust {s.reshard_trust_seconds:g} s; publisher: {s.publisher}",
            f"events: {self.kills} killed (SIGKILL), {self.joins} joined; "
            f"{self.node_processes} node processes in all, {self.alive_at_end} at the end",
        ]
        for r in self.reshards:
            took = "not done" if r.seconds is None else f"{r.seconds:.1f} s"
            lines.append(
                f"reshard {r.from_shards} -> {r.to_shards} (generation {r.gen}): {took}; "
                f"node killed {r.node_killed}, joined {r.node_joined}; command "
                + ("killed at once" if r.command_killed else f"exit {r.command_code}")
            )
        if self.refusal is not None:
            last = self.refusal.output.strip().splitlines()[-1:] or [""]
            lines.append(f"second reshard during the first: exit {self.refusal.code}: {last[0]}")
        deleted = sum(1 for v in self.old_queues.values() if v is None)
        lines.append(
            f"old generations' queues at the end: {len(self.old_queues)}, {deleted} deleted, "
            f"{sum(v or 0 for v in self.old_queues.values())} jobs in the others; "
            f"layout at the end: {self.final_layout}"
        )
        return lines

    def details(self, limit: int = 10) -> str:
        """The first problems of each kind, for an assertion message."""
        return "\n".join(
            f"{kind}: {items[:limit]}" for kind, items in self.problems.items() if items
        )


class _Nodes:
    """The node processes of a run, restarted in their slot after a kill (in the
    elastic layout, a slot per process, never restarted: a killed one leaves it)."""

    def __init__(self, settings: Settings, env: dict[str, str], log_dir: Path) -> None:
        self.settings = settings
        self.env = env
        self.log_dir = log_dir
        self.slots: list[subprocess.Popen[bytes] | None] = [None] * settings.nodes
        self.logs: list[Path] = []
        self.all: list[subprocess.Popen[bytes]] = []
        self.exits: list[tuple[float, int, int, str]] = []  # (monotonic, pid, code, log)
        self.started: dict[int, float] = {}  # pid -> time.monotonic() at start
        self.stopping: list[subprocess.Popen[bytes]] = []  # sent SIGTERM, not reaped
        self.stop_codes: list[int] = []
        self._ledger_read = 0  # bytes of the ledger read by busy()
        self._last_start: dict[int, float] = {}  # pid -> time.time() of its last start

    def placement(self, slot: int) -> list[str]:
        s = self.settings
        if s.elastic:
            return []
        if s.layout == "overlap":
            return ["--node", "0", "--nodes", "1"]
        if s.layout == "split":
            return ["--node", str(slot), "--nodes", str(s.nodes)]
        if slot == s.nodes - 1:  # mixed: the last one owns every shard
            return ["--node", "0", "--nodes", "1"]
        return ["--node", str(slot), "--nodes", str(s.nodes - 1)]

    def start(self, slot: int) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"node{slot}-{len(self.logs)}.log"
        self.logs.append(path)
        with open(path, "wb") as out:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shardq",
                    "run",
                    *self.placement(slot),
                    "--threads",
                    str(self.settings.threads),
                    "--log-level",
                    "info" if self.settings.elastic else "warning",
                    "--log-format",
                    "json",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.slots[slot] = child
        self.all.append(child)
        self.started[child.pid] = time.monotonic()
        return child

    def kill(self, slot: int) -> tuple[int, float]:
        """SIGKILL the slot's process; returns its pid and when it was known dead."""
        child = self.slots[slot]
        assert child is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if self.settings.elastic:
            self.slots[slot] = None
        return child.pid, time.time()

    def join(self) -> subprocess.Popen[bytes]:
        """Start one more node in a new slot (elastic: it joins the fleet)."""
        self.slots.append(None)
        return self.start(len(self.slots) - 1)

    def alive(self) -> list[int]:
        """The slots whose process runs (stopping ones are no longer in a slot)."""
        return [i for i, c in enumerate(self.slots) if c is not None and c.poll() is None]

    def busy(self, slots: list[int], within: float = BUSY_SECONDS) -> list[int]:
        """Those of ``slots`` whose process started a job in the last ``within`` s."""
        self._read_ledger()
        now = time.time()
        return [
            slot
            for slot in slots
            if (child := self.slots[slot]) is not None
            and now - self._last_start.get(child.pid, -math.inf) <= within
        ]

    def serving(self) -> bool:
        """Whether every running node process has started a job (is up and serving)."""
        self._read_ledger()
        return all(c is None or c.pid in self._last_start for c in self.slots)

    def _read_ledger(self) -> None:
        """Read what the nodes appended to the ledger since the last call."""
        try:
            with open(self.env["LEDGER_PATH"], "rb") as f:
                f.seek(self._ledger_read)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._ledger_read += len(complete)
        for line in complete.splitlines():
            entry = json.loads(line)
            if entry["event"] == "start":
                self._last_start[entry["pid"]] = entry["t"]

    def age(self, slot: int) -> float:
        child = self.slots[slot]
        assert child is not None
        return time.monotonic() - self.started[child.pid]

    def stop(self, slot: int) -> tuple[int, float]:
        """SIGTERM the slot's process, not waiting; returns its pid and when it was sent."""
        child = self.slots[slot]
        assert child is not None
        self.slots[slot] = None
        self.stopping.append(child)
        sent = time.time()
        child.send_signal(signal.SIGTERM)
        return child.pid, sent

    def reap_stopped(self, wait: float = 0.0) -> None:
        """Collect the exit codes of stopped processes (waiting up to ``wait`` s for
        each; -1 for one still running then)."""
        for child in list(self.stopping):
            try:
                code = child.wait(wait) if wait else child.poll()
            except subprocess.TimeoutExpired:
                code = -1
            if code is not None:
                self.stopping.remove(child)
                self.stop_codes.append(code)

    def reap_exited(self, restart: bool | None = None) -> None:
        """Note processes that exited on their own, and start them again (by default,
        unless elastic)."""
        if restart is None:
            restart = not self.settings.elastic
        for slot, child in enumerate(self.slots):
            if child is not None and child.poll() is not None:
                log = self.logs[self.all.index(child)]
                self.exits.append((time.monotonic(), child.pid, child.returncode, _tail(log)))
                self.slots[slot] = self.start(slot) if restart else None

    def terminate(self, grace: float) -> list[int]:
        """SIGTERM every running node and wait; returns their exit codes.

        Each node is first waited for until it catches SIGTERM: one that arrives before
        ``shardq run`` installed its handler kills it like any Python process."""
        running = [c for c in self.slots if c is not None and c.poll() is None]
        for child in running:
            wait_catching(child, signal.SIGTERM)
        for child in running:
            child.send_signal(signal.SIGTERM)
        codes = []
        for child in running:
            try:
                codes.append(child.wait(grace))
            except subprocess.TimeoutExpired:
                codes.append(-1)
        return codes

    def kill_all(self) -> None:
        for child in self.all:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
            child.wait()


def jobs_of(settings: Settings) -> tuple[list[list[Job]], set[tuple[str, int]]]:
    """The bursts to publish, in order, and the (entity, n) that fail permanently."""
    rng = random.Random(settings.seed)
    entities = [f"c{e}" for e in range(settings.entities)]
    permanent = {
        (entity, n)
        for entity in entities
        for n in range(settings.jobs)
        if rng.random() < settings.permanent
    }
    bursts = []
    for start in range(0, settings.jobs, settings.burst):
        order = list(entities)
        rng.shuffle(order)
        for entity in order:
            bursts.append(
                [
                    Job(
                        entity,
                        _payload(settings, n, (entity, n) in permanent),
                        dedup_id=f"{entity}-{n}",
                    )
                    for n in range(start, min(settings.jobs, start + settings.burst))
                ]
            )
    return bursts, permanent


def _payload(settings: Settings, n: int, permanent: bool) -> dict[str, Any]:
    payload: dict[str, Any] = {"n": n, "fail_rate": settings.fail_rate}
    if settings.sleep:
        payload["sleep"] = settings.sleep
    if permanent:
        payload["permanent"] = True
    return payload


class Publisher(threading.Thread):
    """Publishes the bursts in slices spread over a window; retries a slice that fails.
    ``on_sent(t, jobs)`` is told of each slice sent (the publisher process's record)."""

    def __init__(
        self,
        bursts: list[list[Job]],
        window: float,
        on_sent: Callable[[float, list[tuple[str, int]]], None] | None = None,
    ):
        super().__init__(name="chaos-publisher", daemon=True)
        self.bursts = bursts
        self.window = window
        self.on_sent = on_sent
        self.published = 0
        self.retries = 0
        self.confirmed: dict[tuple[str, int], float] = {}  # job -> when its send returned
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def halt(self) -> None:
        self.stop.set()

    def run(self) -> None:
        try:
            slices = max(1, min(len(self.bursts), int(self.window / 0.2)))
            per = math.ceil(len(self.bursts) / slices)
            started = time.monotonic()
            for i in range(0, len(self.bursts), per):
                if self.stop.is_set():
                    return
                due = started + self.window * i / len(self.bursts)
                self.stop.wait(max(0.0, due - time.monotonic()))
                items = [job for burst in self.bursts[i : i + per] for job in burst]
                self._send(items)
        except BaseException as exc:
            self.error = exc

    def _send(self, items: list[Job]) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                Ledgered.publish_many(items)
                self.published += len(items)
                done = time.time()
                for job in items:
                    self.confirmed[(job.entity_id, job.payload["n"])] = done
                if self.on_sent is not None:
                    self.on_sent(done, [(job.entity_id, job.payload["n"]) for job in items])
                return
            except ShardqError:  # the broker is away: same dedup ids, so send again
                if time.monotonic() > deadline or self.stop.is_set():
                    raise
                self.retries += 1
                time.sleep(1.0)


def run(
    settings: Settings,
    env: dict[str, str],
    log_dir: Path,
    outage: Outage | None = None,
    say: Callable[[str], None] = lambda _: None,
    driver_env: dict[str, str] | None = None,
) -> Report:
    """One chaos run on the broker that ``env`` (``SHARDQ_*`` variables) names.
    ``driver_env`` overrides variables for this process only (e.g. an endpoint that
    bypasses a counting proxy the nodes and the publisher use)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **env,
        "LEDGER_PATH": env.get("LEDGER_PATH", str(log_dir / "ledger.jsonl")),
        "SHARDQ_APP": "tests.apps.ledger",
        f"SHARDQ_WORKERS__{WORKER}__shards": str(settings.shards),
        f"SHARDQ_WORKERS__{WORKER}__visibility_timeout": str(settings.visibility_timeout),
        "SHARDQ_GRACE_SECONDS": "20",
        "SHARDQ_CONCURRENCY": str(settings.concurrency),
    }
    env.setdefault("SHARDQ_IDLE_WAIT_SECONDS", "1")
    if settings.elastic:
        env["SHARDQ_LEASE_SECONDS"] = str(settings.lease_seconds)
        env["SHARDQ_REPORT_SECONDS"] = str(settings.report_seconds)
    if settings.reshards:
        env["SHARDQ_LAYOUT_REFRESH_SECONDS"] = str(settings.layout_refresh_seconds)
        env["SHARDQ_RESHARD_TRUST_SECONDS"] = str(settings.reshard_trust_seconds)
    mine = {**env, **(driver_env or {})}
    config = Config.load(env={k: v for k, v in mine.items() if k.startswith("SHARDQ_")})
    ledger.app.configure(config)
    app = ledger.app
    report = Report(settings, app.broker.kind, log_dir=str(log_dir))
    rng = random.Random(settings.seed + 1)
    bursts, permanent = jobs_of(settings)
    report.permanent = len(permanent)
    expected = {f"c{e}": settings.jobs for e in range(settings.entities)}
    nodes = _Nodes(settings, {**os.environ, **env}, log_dir)
    publisher: Publisher | PublisherProcess = (
        PublisherProcess(settings, {**os.environ, **env}, log_dir)
        if settings.publisher == "process"
        else Publisher(bursts, settings.publish_window)
    )
    began = time.monotonic()
    try:
        app.ensure_queues()
        for slot in range(settings.nodes):
            nodes.start(slot)
        publisher.start()
        say(f"chaos: {settings.nodes} nodes ({settings.layout}), publishing, killing ...")
        if settings.reshards:
            _wait_serving(nodes, began)
            chaos_reshard.reshard_phase(
                settings, app, {**os.environ, **env}, nodes, report, began, say
            )
        elif settings.elastic:
            _elastic_phase(settings, nodes, report, rng, began, say)
        else:
            _chaos_phase(settings, nodes, report, rng, began, outage, say)
        publisher.join(settings.drain_timeout)
        if publisher.error is not None:
            raise publisher.error
        if publisher.is_alive():
            raise AssertionError("the publisher did not finish")
        report.published, report.publish_retries = publisher.published, publisher.retries
        drained_from = time.monotonic()
        say(f"chaos: {report.kills} kills done; waiting for the queues to drain ...")
        drained = _wait_drained(app, settings, nodes, settings.drain_timeout)
        report.drain_seconds = time.monotonic() - drained_from
        nodes.reap_exited(restart=False)
        nodes.reap_stopped(wait=30)
        report.alive_at_end = len(nodes.alive())
        report.exit_codes = nodes.terminate(grace=30)
        report.wall_seconds = time.monotonic() - began
        if settings.reshards:
            report.old_queues = chaos_reshard.old_queues(app, report.reshards)
            app.layouts.refresh()
            layout = app.layouts.cached(WORKER)
            report.final_layout = {
                "gen": layout.gen,
                "shards": layout.shards,
                "moving": layout.moving is not None,
            }
        morgued, report.morgue_reasons = read_morgue(app)
        report.morgued = len(morgued)
    finally:
        publisher.halt()
        nodes.kill_all()
    report.node_processes = len(nodes.all)
    report.stop_codes = nodes.stop_codes
    entries = ledger.read(env["LEDGER_PATH"]) if Path(env["LEDGER_PATH"]).exists() else []
    report.executions = sum(1 for e in entries if e["event"] == "start")
    report.failed_attempts = sum(1 for e in entries if e["event"] == "fail")
    report.interrupted = _interrupted(entries, report.killed)
    problems = ledger.check(entries, expected, set(morgued), report.killed)
    report.duplicates = len(problems["duplicates"])
    del problems["duplicates"]  # allowed after a kill; bad_duplicates are the others
    if report.outage_wall is not None:  # and after an outage: see _outage_duplicates
        excused = _outage_duplicates(entries, problems["bad_duplicates"], report.outage_wall)
        report.outage_duplicates = len(excused)
        problems["bad_duplicates"] = [d for d in problems["bad_duplicates"] if d not in excused]
    problems["not_drained"] = [] if drained else ["shard queues still hold jobs"]
    problems["unexpected_morgue"] = sorted(set(morgued) - permanent)
    problems["node_exits"] = [
        (round(t - began, 1), pid, code, tail)
        for t, pid, code, tail in nodes.exits
        if not _during(report.outage, t - began)
    ]
    problems["unclean_stop"] = [c for c in report.exit_codes + report.stop_codes if c != 0]
    if settings.reshards:
        problems["reshard"] = _reshard_problems(settings, report)
    elif settings.elastic:  # (shard_of below knows one layout: not for a reshard run)
        report.takeovers = _takeovers(settings, entries, report.deaths, nodes, publisher)
        problems["slow_takeover"] = [
            t
            for t in report.takeovers
            if t.kind in (KILL, STOP) and not t.relayed and t.seconds > settings.takeover_bound
        ]
    problems["crashes_logged"] = []
    for path in nodes.logs:
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            name = str(event.get("event"))
            if event.get("level") in ("warning", "error"):
                report.log_events[name] = report.log_events.get(name, 0) + 1
            if name in CRASHES:
                problems["crashes_logged"].append((path.name, name))
    report.problems = problems
    return report


def _reshard_problems(settings: Settings, report: Report) -> list[str]:
    """What went wrong with the reshards themselves."""
    found = []
    for r in report.reshards:
        if r.seconds is None:
            found.append(f"the reshard to {r.to_shards} did not end")
        if not r.command_killed and r.command_code != 0:
            found.append(f"shardq reshard to {r.to_shards} exited {r.command_code}")
    refusal = report.refusal
    if refusal is None or refusal.code == 0 or chaos_reshard.IN_PROGRESS not in refusal.output:
        found.append(f"a second reshard during the first was not refused: {refusal}")
    found += [f"{q} holds {n} jobs" for q, n in report.old_queues.items() if n]
    gens = len(settings.reshards)
    want = {"gen": gens, "shards": settings.reshards[-1][1], "moving": False}
    if report.final_layout != want:
        found.append(f"the layout ended as {report.final_layout}, not {want}")
    return found


def _interrupted(entries: list[dict[str, Any]], killed: dict[int, float]) -> int:
    """Executions started in a killed process that never ended or failed."""
    open_runs: set[tuple[int, int, str, int]] = set()
    for e in entries:
        if e["pid"] not in killed:
            continue
        key = (e["pid"], e["tid"], e["entity"], e["n"])
        if e["event"] == "start":
            open_runs.add(key)
        else:
            open_runs.discard(key)
    return len(open_runs)


def _outage_duplicates(
    entries: list[dict[str, Any]], duplicates: list[Any], outage: tuple[float, float]
) -> set[tuple[str, int]]:
    """Duplicates whose first success was near the outage: the job ran, its delete could
    not reach the broker (or its visibility ran out meanwhile), so it ran again after.
    At least once, as documented; only those within OUTAGE_MARGIN s of it are excused."""
    first_end: dict[tuple[str, int], float] = {}
    for e in sorted(entries, key=lambda e: e["t"]):
        if e["event"] == "end":
            first_end.setdefault((e["entity"], e["n"]), e["t"])
    down, up = outage[0] - OUTAGE_MARGIN, outage[1] + OUTAGE_MARGIN
    return {(entity, n) for entity, n in duplicates if down <= first_end[(entity, n)] <= up}


def _during(outage: tuple[float, float] | None, t: float) -> bool:
    """A node may exit while the broker is away (it cannot create its queues)."""
    return outage is not None and outage[0] <= t <= outage[1] + 10


def _chaos_phase(
    settings: Settings,
    nodes: _Nodes,
    report: Report,
    rng: random.Random,
    began: float,
    outage: Outage | None,
    say: Callable[[str], None],
) -> None:
    end = began + settings.duration
    next_kill = began + (rng.uniform(*settings.kill_every) if settings.kill_every else math.inf)
    outage_due = began + settings.outage_at if settings.outage_at is not None else math.inf
    # the outage waits (up to READY_SECONDS) for every node to serve: on a loaded
    # machine a node may still be starting, and one that meets the outage then exits
    while (now := time.monotonic()) < end or (outage is not None and outage_due < math.inf):
        nodes.reap_exited()
        ready = now >= outage_due + READY_SECONDS or (now >= outage_due and nodes.serving())
        if outage is not None and ready:
            outage_due = math.inf
            say(f"chaos: broker outage for {settings.outage_seconds:g} s")
            down, down_wall = time.monotonic() - began, time.time()
            outage.stop()  # the publisher's sends fail meanwhile: it sends them again
            time.sleep(settings.outage_seconds)
            outage.start()
            report.outage = (down, time.monotonic() - began)
            report.outage_wall = (down_wall, time.time())
            next_kill = time.monotonic() + (
                rng.uniform(*settings.kill_every) if settings.kill_every else math.inf
            )
            continue
        if now >= next_kill:
            assert settings.kill_every is not None
            slot = rng.randrange(settings.nodes)
            pid, dead = nodes.kill(slot)
            report.killed[pid] = dead
            report.kills += 1
            nodes.start(slot)
            next_kill = time.monotonic() + rng.uniform(*settings.kill_every)
        time.sleep(0.05)


def _elastic_phase(
    settings: Settings,
    nodes: _Nodes,
    report: Report,
    rng: random.Random,
    began: float,
    say: Callable[[str], None],
) -> None:
    """Every ``event_every`` s, one of kill / join / stop at random, among those that
    keep 1..max_nodes nodes alive; the node to kill or stop is a busy one (see
    BUSY_SECONDS), and a stop only hits a node at least MIN_AGE s old. The events begin
    once every node serves (at most READY_SECONDS after the start): on a loaded
    machine a node may still be starting, and a node killed before it took shards
    leaves no takeover to measure."""
    _wait_serving(nodes, began)
    start = time.monotonic()
    end = start + settings.duration
    next_event = start + rng.uniform(*settings.event_every)
    while time.monotonic() < end:
        nodes.reap_exited()
        nodes.reap_stopped()
        if time.monotonic() >= next_event:
            _elastic_event(settings, nodes, report, rng, say)
            next_event = time.monotonic() + rng.uniform(*settings.event_every)
        time.sleep(0.05)


def _wait_serving(nodes: _Nodes, began: float) -> None:
    """Until every node serves, at most until READY_SECONDS past ``began``."""
    ready = began + READY_SECONDS
    while time.monotonic() < ready and not nodes.serving():
        nodes.reap_exited()
        time.sleep(0.05)


def _elastic_event(
    settings: Settings,
    nodes: _Nodes,
    report: Report,
    rng: random.Random,
    say: Callable[[str], None],
) -> None:
    alive = nodes.alive()
    busy = nodes.busy(alive) or alive
    grown = [slot for slot in busy if nodes.age(slot) >= MIN_AGE]
    kinds = []
    if len(alive) > 1:
        kinds.append(KILL)
        if grown:
            kinds.append(STOP)
    if len(alive) < settings.max_nodes:
        kinds.append("join")
    # the first event is a kill, early enough for a takeover to be measured while jobs flow
    kind = KILL if KILL in kinds and not report.kills else rng.choice(kinds)
    if kind == KILL:
        pid, dead = nodes.kill(rng.choice(busy))
        report.killed[pid] = dead
        report.kills += 1
        report.deaths.append(Departure(pid, dead, KILL))
    elif kind == STOP:
        pid, sent = nodes.stop(rng.choice(grown))
        report.stops += 1
        report.deaths.append(Departure(pid, sent, STOP))
    else:
        pid = nodes.join().pid
        report.joins += 1
    say(f"chaos: {kind} {pid} ({len(nodes.alive())} nodes alive)")


def _takeovers(
    settings: Settings,
    entries: list[dict[str, Any]],
    deaths: list[Departure],
    nodes: _Nodes,
    publisher: Publisher | PublisherProcess,
) -> list[Takeover]:
    """Takeovers after each death, and after each rebalance handover (a shard released
    by a node that kept running)."""
    holds = Holds([], [])
    for child, path in zip(nodes.all, nodes.logs, strict=True):
        found = read_log(path, child.pid, WORKER)
        holds.took.extend(found.took)
        holds.released.extend(found.released)
    died = {d.pid: d.t for d in deaths}
    handovers = [
        Departure(pid, t, HANDOVER, shard)
        for t, pid, shard in holds.released
        if t < died.get(pid, math.inf)
    ]

    def shard_of(entity: str) -> int:
        return shard_for(entity, settings.shards)

    return measure(entries, [*deaths, *handovers], shard_of, publisher.confirmed, holds)


def _wait_drained(app: Any, settings: Settings, nodes: _Nodes, timeout: float) -> bool:
    """True once every shard queue is empty twice in a row (polled every 0.5 s)."""
    queues = [app.shard_queue(WORKER, s) for s in range(settings.shards)]
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        nodes.reap_exited()
        try:
            if settings.reshards:  # every generation served, and no move under way
                queues = chaos_reshard.live_queues(app)
            counts = [_held(app, q) for q in queues]
        except ShardqError:
            quiet = 0
        else:
            empty = all(n == 0 for n in counts)
            if settings.reshards and chaos_reshard.moving(app):
                empty = False
            quiet = quiet + 1 if empty else 0
            if quiet >= 2:
                return True
        time.sleep(0.5)
    return False


def _held(app: Any, queue: str) -> int:
    """Jobs in ``queue``, waiting or in flight (0 once a retired queue was deleted)."""
    try:
        counts = app.broker.counts(queue)
    except QueueNotFoundError:
        return 0
    return int(counts.waiting + counts.in_flight)


def read_morgue(app: Any) -> tuple[set[tuple[str, int]], dict[str, int]]:
    """Every dead job of the worker as (entity, n), and counts by reason, after checking
    the morgue's size against the records read."""
    dead = morgue.Morgue(app, WORKER)
    size = dead.size(exact=True)
    records = dead.page(limit=size + 1).records
    found: dict[tuple[str, int], str] = {}
    for record in records:
        payload = morgue.payload_of(record)
        found.setdefault((record.entity_id, payload["n"]), record.reason)
    if len(records) != size:
        raise AssertionError(f"the morgue held {size} jobs but {len(records)} were read")
    return set(found), dict(Counter(found.values()))


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def write_json(report: Report, out: IO[str]) -> None:
    doc = {k: v for k, v in report.__dict__.items() if k not in ("settings", "problems")}
    doc["settings"] = report.settings.__dict__
    doc["deaths"] = [asdict(d) for d in report.deaths]
    doc["takeovers"] = [asdict(t) for t in report.takeovers]
    doc["problems"] = {k: len(v) for k, v in report.problems.items()}
    json.dump(doc, out, indent=2, default=str)
