"""The chaos run's reshards: ``shardq reshard`` child processes while jobs flow.

Used by :mod:`tests.chaos` when ``Settings.reshards`` is given (elastic layout). For
each reshard, at its time:

1. ``shardq reshard WORKER --shards N`` starts as a child process; once it printed
   that the reshard began, it is SIGKILLed if its index is in
   ``kill_reshard_command`` (the nodes must finish the move alone). During the first
   reshard, a second ``shardq reshard`` is run too: it must exit non-zero saying a
   reshard is in progress;
2. ``reshard_kill_after`` s after it began, a node that ran a job lately gets SIGKILL
   and a new node joins;
3. the driver reads the worker's layout item every 0.5 s until the move is done, and
   records when it saw it begin and end (on this driver's clock).

Afterwards: :func:`live_queues` (what the drain waits on), :func:`old_queues` (each
queue of a generation left behind: deleted, or how many jobs it still holds) and
:func:`pauses` (how long entities with work waiting did not run, during the
reshards and outside them).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardq.core.errors import QueueNotFoundError, ShardqError

if TYPE_CHECKING:
    from shardq.api.app import App
    from tests.chaos import Report, Settings, _Nodes

ROOT = Path(__file__).resolve().parent.parent
WORKER = "Ledgered"
#: Seconds a reshard may take, from its start until the nodes ended the move.
MOVE_TIMEOUT = 240.0
#: What a second ``shardq reshard`` during a move must say.
IN_PROGRESS = "is in progress"


@dataclass
class Reshard:
    """One reshard of the run, as it happened."""

    to_shards: int
    from_shards: int = 0
    from_gen: int = 0
    gen: int = 0
    began: float = 0.0  # the document's ``started`` (time.time())
    seen_done: float | None = None  # when the driver first read the move as done
    ended: float | None = None  # the retired generation's ``ended`` in the document
    command_killed: bool = False
    command_code: int | None = None
    command_output: str = ""
    node_killed: int | None = None  # pid of the node SIGKILLed during it
    node_joined: int | None = None

    @property
    def seconds(self) -> float | None:
        """From its start to the move's end."""
        end = self.ended if self.ended is not None else self.seen_done
        return None if end is None else end - self.began


@dataclass
class Refusal:
    """A second ``shardq reshard`` run while one was in progress."""

    code: int
    output: str


class _Command:
    """A ``shardq reshard`` child process whose output is read as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "shardq", "reshard", WORKER, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.child.poll() is not None:
                self._reader.join(5)
                return any(text in line for line in self.lines)
            time.sleep(0.02)
        return False

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, signal.SIGKILL)
        self.child.wait()
        self._reader.join(5)

    def finish(self, timeout: float) -> int:
        try:
            code = self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = -9
        self._reader.join(5)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def reshard_phase(
    settings: Settings,
    app: App,
    env: dict[str, str],
    nodes: _Nodes,
    report: Report,
    began: float,
    say: Callable[[str], None],
) -> None:
    """The reshards of ``settings``, in order, each followed until its move ended."""
    for index, (at, shards) in enumerate(settings.reshards):
        _sleep_until(began + at, nodes)
        record = Reshard(shards)
        report.reshards.append(record)
        app.layouts.refresh()
        before = app.layouts.cached(WORKER)
        record.from_shards, record.from_gen = before.shards, before.gen
        say(f"chaos: shardq reshard {WORKER} --shards {shards} (from {before.shards})")
        command = _Command(["--shards", str(shards)], env)
        if not command.wait_for("announced", 60):
            command.kill()
            record.command_code, record.command_output = command.child.returncode, command.output
            raise AssertionError(f"shardq reshard did not begin: {command.output}")
        if index in settings.kill_reshard_command:
            command.kill()
            record.command_killed = True
            say(f"chaos: shardq reshard (pid {command.child.pid}) killed with SIGKILL")
        app.layouts.refresh()
        now = app.layouts.cached(WORKER)
        if now.moving is not None:
            record.began, record.gen = time.time(), now.gen
        if index == 0:
            second = _Command(["--shards", str(shards + 1), "--no-wait"], env)
            report.refusal = Refusal(second.finish(60), second.output)
        if settings.reshard_kill:
            _sleep_until(time.monotonic() + settings.reshard_kill_after, nodes)
            _kill_and_replace(nodes, report, record, say)
        _follow(app, record, nodes)
        say(f"chaos: reshard to {shards} done in {record.seconds or -1:.1f} s")
        if not record.command_killed:
            record.command_code = command.finish(60)
        record.command_output = command.output
    _sleep_until(began + settings.duration, nodes)


def _kill_and_replace(
    nodes: _Nodes, report: Report, record: Reshard, say: Callable[[str], None]
) -> None:
    from tests.takeover import KILL, Departure

    alive = nodes.alive()
    busy = nodes.busy(alive) or alive
    if not busy:
        return
    pid, dead = nodes.kill(busy[0])
    report.killed[pid] = dead
    report.kills += 1
    report.deaths.append(Departure(pid, dead, KILL))
    record.node_killed = pid
    record.node_joined = nodes.join().pid
    report.joins += 1
    say(f"chaos: node {pid} killed during the reshard, {record.node_joined} joined")


def _follow(app: App, record: Reshard, nodes: _Nodes) -> None:
    """Read the layout document until the move of ``record`` ended."""
    deadline = time.monotonic() + MOVE_TIMEOUT
    while time.monotonic() < deadline:
        nodes.reap_exited()
        try:
            app.layouts.refresh()
        except ShardqError:
            time.sleep(0.5)
            continue
        layout = app.layouts.cached(WORKER)
        if layout.moving is None or layout.gen != record.gen:
            record.seen_done = time.time()
            record.ended = record.seen_done
            return
        time.sleep(0.5)


def _sleep_until(due: float, nodes: _Nodes) -> None:
    while time.monotonic() < due:
        nodes.reap_exited()
        nodes.reap_stopped()
        time.sleep(min(0.05, max(0.0, due - time.monotonic())))


# -- afterwards ----------------------------------------------------------------------------
def live_queues(app: App) -> list[str]:
    """The queues of every generation the live layout still serves."""
    app.layouts.refresh()
    layout = app.layouts.cached(WORKER)
    gens = {layout.gen: list(range(layout.shards))}
    if layout.moving is not None:
        gens[layout.moving.gen] = list(range(layout.moving.shards))
    for old in layout.retired:
        gens[old.gen] = old.left
    return [app.shard_queue(WORKER, shard, gen) for gen in sorted(gens) for shard in gens[gen]]


def moving(app: App) -> bool:
    """Whether the copy in hand shows a move of the worker in progress."""
    return app.layouts.cached(WORKER).moving is not None


def old_queues(app: App, reshards: Iterable[Reshard]) -> dict[str, int | None]:
    """Every queue of a generation left behind: the jobs it holds (waiting and in
    flight), or None once deleted."""
    found: dict[str, int | None] = {}
    for record in reshards:
        for shard in range(record.from_shards):
            queue = app.shard_queue(WORKER, shard, record.from_gen)
            try:
                counts = app.broker.counts(queue)
            except QueueNotFoundError:
                found[queue] = None
            else:
                found[queue] = counts.waiting + counts.in_flight
    return found


# -- the publisher process -------------------------------------------------------------------
class PublisherProcess:
    """:mod:`tests.chaos_publisher` as a child process, seen like the publisher thread."""

    def __init__(self, settings: Settings, env: dict[str, str], log_dir: Path) -> None:
        from dataclasses import asdict

        self.settings_path = log_dir / "publisher-settings.json"
        self.settings_path.write_text(json.dumps(asdict(settings)))
        self.out = log_dir / "published.jsonl"
        self.log = log_dir / "publisher.log"
        self.env = env
        self.child: subprocess.Popen[bytes] | None = None
        self.published = 0
        self.retries = 0
        self.confirmed: dict[tuple[str, int], float] = {}
        self.error: BaseException | None = None

    def start(self) -> None:
        with open(self.log, "wb") as log:
            self.child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.chaos_publisher",
                    str(self.settings_path),
                    str(self.out),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def is_alive(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def join(self, timeout: float | None = None) -> None:
        assert self.child is not None
        try:
            code = self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self._read()
        if code != 0 and self.error is None:
            tail = self.log.read_text(errors="replace")[-2000:]
            self.error = AssertionError(f"the publisher process exited {code}: {tail}")

    def _read(self) -> None:
        if not self.out.exists():
            return
        for line in self.out.read_text().splitlines():
            item = json.loads(line)
            if "jobs" in item:
                for entity, n in item["jobs"]:
                    self.confirmed[(entity, n)] = item["t"]
            else:
                self.published, self.retries = item["published"], item["retries"]
                if "error" in item:
                    self.error = AssertionError(f"the publisher failed: {item['error']}")

    def halt(self) -> None:
        if self.is_alive():
            assert self.child is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGKILL)
        if self.child is not None:
            self.child.wait()


# -- pauses --------------------------------------------------------------------------------
@dataclass
class Pauses:
    """How long entities with a job ready did not run, inside a window or outside."""

    count: int = 0
    longest: float = 0.0
    worst: tuple[str, int] | None = None  # (entity, n) of the job that waited longest
    values: list[float] = field(default_factory=list)
    by_entity: dict[str, float] = field(default_factory=dict)  # its longest pause

    def add(self, seconds: float, job: tuple[str, int]) -> None:
        self.count += 1
        self.values.append(seconds)
        self.by_entity[job[0]] = max(seconds, self.by_entity.get(job[0], 0.0))
        if seconds > self.longest:
            self.longest, self.worst = seconds, job

    def quantile(self, q: float) -> float:
        if not self.values:
            return 0.0
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def text(self, over: float = 10.0) -> str:
        slow = sum(1 for v in self.by_entity.values() if v > over)
        return (
            f"{self.count} gaps of {len(self.by_entity)} entities, longest {self.longest:.2f} s "
            f"({self.worst}), p99 {self.quantile(0.99):.2f} s, median "
            f"{self.quantile(0.5):.3f} s; {slow} entities paused over {over:g} s"
        )


def pauses(
    entries: list[dict[str, Any]],
    confirmed: dict[tuple[str, int], float],
    windows: list[tuple[float, float]],
) -> tuple[list[Pauses], Pauses]:
    """Per window, and outside every window: for each pair of consecutive jobs of an
    entity (by number, both succeeded), the time from when the later one was ready
    (published, and the earlier one done) to its first success. A gap belongs to the
    first window it overlaps."""
    first_end: dict[tuple[str, int], float] = {}
    for e in entries:
        if e["event"] == "end":
            key = (e["entity"], e["n"])
            first_end[key] = min(first_end.get(key, e["t"]), e["t"])
    by_entity: dict[str, list[int]] = {}
    for entity, n in first_end:
        by_entity.setdefault(entity, []).append(n)
    inside = [Pauses() for _ in windows]
    outside = Pauses()
    for entity, numbers in by_entity.items():
        numbers.sort()
        for a, b in itertools.pairwise(numbers):
            if (entity, b) not in confirmed:
                continue
            ready = max(first_end[(entity, a)], confirmed[(entity, b)])
            done = first_end[(entity, b)]
            gap = max(0.0, done - ready)
            for i, (lo, hi) in enumerate(windows):
                if ready <= hi and done >= lo:
                    inside[i].add(gap, (entity, b))
                    break
            else:
                outside.add(gap, (entity, b))
    return inside, outside
