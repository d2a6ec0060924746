"""Takeover times of an elastic chaos run, measured from the ledger.

When a node dies (SIGKILL) or stops gracefully (SIGTERM), the shards it was serving
must be served again by another node: after a kill within the lease timeout (plus
10 s), after a graceful stop within seconds (the leases are handed back at once).

For each departure of process P at time ``t`` (when it was known dead, or when it was
sent SIGTERM) and each shard S:

* **P was serving S** when P is the last process that, before ``t``, started a job of
  S (the ledger) or took S's lease (``fleet.took`` in its log: a node may take a shard
  and die before it runs a job of it), and P had not released S since
  (``node.shard_released``: a shard handed over to another node on a rebalance);
* **S had jobs waiting** when another process started, after ``t``, a job of S that
  was published (its publish call returned) before ``t`` + :data:`DEMAND_SECONDS`.
  A shard with no job for a while after ``t`` is not judged: its first start would
  measure the publisher, not the takeover;
* the **takeover time** is from ``t`` to the first start of a job of S by a process
  other than P. It is an upper bound of when S was served again: the taker may have
  held the lease a little earlier, with no job it could start yet.

A takeover is **relayed** when the shard's next holder departed too before it started
a job of S (it took the lease, then was killed or stopped): that departure is
measured on its own, and the first one is not judged (its clock includes the second).

Rebalance **handovers** are measured the same way (kind ``handover``, from the
``node.shard_released`` of a running node to the first start of S elsewhere), for
the record: the fleet drains a shard before it releases it, so no bound applies
beyond "soon".
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

KILL, STOP, HANDOVER = "kill", "stop", "handover"
#: Seconds after a departure within which a published job still counts as waiting.
DEMAND_SECONDS = 1.0


@dataclass(frozen=True)
class Departure:
    """A node process that went (``kill``, ``stop``), or that released one shard
    (``handover``, with ``shard``). ``t`` is a ``time.time()``."""

    pid: int
    t: float
    kind: str
    shard: int | None = None


@dataclass(frozen=True)
class Takeover:
    """One shard of one departure, and how long until another process served it."""

    pid: int
    kind: str
    shard: int
    left: float
    seconds: float
    relayed: bool = False


@dataclass(frozen=True)
class Holds:
    """From one node's log: when it took a shard's lease and when it released a shard."""

    took: list[tuple[float, int, int]]  # (time, pid, shard)
    released: list[tuple[float, int, int]]


def read_log(path: Path, pid: int, worker: str) -> Holds:
    """The ``fleet.took`` and ``node.shard_released`` of ``worker`` in a node's JSON log."""
    holds = Holds([], [])
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        name, key = event.get("event"), str(event.get("shard", ""))
        if name == "fleet.took" and key.startswith(f"{worker}:"):
            shard = key[len(worker) + 1 :]
            found = holds.took
        elif name == "node.shard_released" and key.startswith(f"{worker}[") and key[-1] == "]":
            shard = key[len(worker) + 1 : -1]
            found = holds.released
        else:
            continue
        if shard.isdigit():
            t = datetime.fromisoformat(str(event["timestamp"])).timestamp()
            found.append((t, pid, int(shard)))
    return holds


def measure(
    entries: Iterable[Mapping[str, Any]],
    departures: Sequence[Departure],
    shard_of: Callable[[str], int],
    published: Mapping[tuple[str, int], float],
    holds: Holds = Holds([], []),
) -> list[Takeover]:
    """Every (departure, shard) the node was serving that had jobs waiting."""
    history: dict[int, list[tuple[float, int | None]]] = {}  # shard -> (time, holder)
    starts: dict[int, list[Mapping[str, Any]]] = {}  # shard -> ledger starts
    for e in entries:
        if e["event"] == "start":
            shard = shard_of(e["entity"])
            starts.setdefault(shard, []).append(e)
            history.setdefault(shard, []).append((e["t"], e["pid"]))
    for t, pid, shard in holds.took:
        history.setdefault(shard, []).append((t, pid))
    for t, _pid, shard in holds.released:
        history.setdefault(shard, []).append((t, None))
    for events in history.values():
        events.sort(key=lambda h: h[0])
    for events in starts.values():
        events.sort(key=lambda e: e["t"])
    times = {shard: [t for t, _ in events] for shard, events in history.items()}

    def holder(shard: int, t: float) -> int | None:
        i = bisect.bisect_left(times.get(shard, []), t)
        return history[shard][i - 1][1] if i else None

    found = []
    for gone in departures:
        for shard, events in sorted(starts.items()):
            if gone.shard is None and holder(shard, gone.t) != gone.pid:
                continue
            if gone.shard is not None and shard != gone.shard:
                continue
            later = [e for e in events if e["t"] > gone.t and e["pid"] != gone.pid]
            due = gone.t + DEMAND_SECONDS
            if not any(published.get((e["entity"], e["n"]), math.inf) < due for e in later):
                continue
            served = later[0]["t"]
            relayed = any(
                other.shard is None
                and other.pid != gone.pid
                and gone.t < other.t < served
                and holder(shard, other.t) == other.pid
                for other in departures
            )
            found.append(Takeover(gone.pid, gone.kind, shard, gone.t, served - gone.t, relayed))
    return found


@dataclass(frozen=True)
class Figures:
    """Takeover times of one kind of departure: how many, p50, max."""

    count: int
    relayed: int
    p50: float
    max: float

    def text(self) -> str:
        if not self.count:
            return f"none measured ({self.relayed} relayed)"
        return (
            f"{self.count} shard takeovers, p50 {self.p50:.1f} s, max {self.max:.1f} s"
            f" ({self.relayed} relayed, not judged)"
        )


def figures(takeovers: Sequence[Takeover], kind: str) -> Figures:
    """The figures of one kind of departure."""
    judged = [t.seconds for t in takeovers if t.kind == kind and not t.relayed]
    relayed = sum(1 for t in takeovers if t.kind == kind and t.relayed)
    if not judged:
        return Figures(0, relayed, math.nan, math.nan)
    return Figures(len(judged), relayed, statistics.median(judged), max(judged))
