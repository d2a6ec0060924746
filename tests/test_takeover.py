"""How the chaos driver measures takeover times from a ledger (``tests/takeover.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.takeover import (
    HANDOVER,
    KILL,
    STOP,
    Departure,
    Holds,
    figures,
    measure,
    read_log,
)

#: Entity "s<k>-<i>" is in shard k.
SHARD_OF = {"s0-a": 0, "s0-b": 0, "s1-a": 1}


def start(entity: str, n: int, pid: int, t: float) -> dict[str, Any]:
    return {"event": "start", "entity": entity, "n": n, "pid": pid, "tid": 1, "t": t}


def shard_of(entity: str) -> int:
    return SHARD_OF[entity]


def test_a_killed_nodes_shard_is_timed_until_another_process_starts_one_of_its_jobs() -> None:
    # given process 1 ran jobs of shard 0 and 1 and was killed at t=100, with jobs of
    # both shards published before; process 2 ran shard 0 at 108 and shard 1 at 112
    entries = [
        start("s0-a", 0, 1, 90.0),
        start("s1-a", 0, 1, 95.0),
        start("s0-a", 1, 2, 108.0),
        start("s0-b", 0, 2, 109.0),
        start("s1-a", 1, 2, 112.0),
    ]
    published = {("s0-a", 1): 99.0, ("s0-b", 0): 99.5, ("s1-a", 1): 98.0}
    # when the takeovers are measured
    found = measure(entries, [Departure(1, 100.0, KILL)], shard_of, published)
    # then each shard counts from the death to its first start elsewhere
    assert [(t.shard, t.seconds, t.relayed) for t in found] == [(0, 8.0, False), (1, 12.0, False)]
    assert figures(found, KILL).max == 12.0
    assert figures(found, KILL).p50 == 10.0
    assert figures(found, STOP).count == 0


def test_a_shard_with_no_job_waiting_or_served_by_another_process_is_not_judged() -> None:
    # given process 1 ran shard 0 and was stopped at 100; shard 0's next job was
    # published 20 s later; shard 1 was last run by process 3, not by 1
    entries = [
        start("s0-a", 0, 1, 90.0),
        start("s1-a", 0, 3, 95.0),
        start("s0-a", 1, 2, 121.0),
        start("s1-a", 1, 2, 101.0),
    ]
    published = {("s0-a", 1): 120.0, ("s1-a", 1): 99.0}
    # when measured, then neither shard is a takeover of process 1
    assert measure(entries, [Departure(1, 100.0, STOP)], shard_of, published) == []


def test_a_shard_released_before_the_death_is_a_handover_not_a_takeover() -> None:
    # given process 1 ran shard 0, released it at 98 (a rebalance) and died at 100;
    # process 2 started it at 103
    entries = [start("s0-a", 0, 1, 90.0), start("s0-a", 1, 2, 103.0)]
    published = {("s0-a", 1): 95.0}
    holds = Holds(took=[], released=[(98.0, 1, 0)])
    departures = [Departure(1, 100.0, KILL), Departure(1, 98.0, HANDOVER, 0)]
    # when measured
    found = measure(entries, departures, shard_of, published, holds)
    # then it counts as a handover of 5 s, and not against the kill
    assert [(t.kind, t.shard, t.seconds) for t in found] == [(HANDOVER, 0, 5.0)]


def test_a_takeover_whose_taker_died_before_running_a_job_is_relayed() -> None:
    # given process 1 ran shard 0 and was killed at 100; process 2 took its lease at
    # 110 and was killed at 111 before running a job; process 3 ran it at 125
    entries = [start("s0-a", 0, 1, 90.0), start("s0-a", 1, 3, 125.0)]
    published = {("s0-a", 1): 95.0}
    holds = Holds(took=[(110.0, 2, 0)], released=[])
    deaths = [Departure(1, 100.0, KILL), Departure(2, 111.0, KILL)]
    # when measured
    found = measure(entries, deaths, shard_of, published, holds)
    # then the first death is relayed (not judged) and the second one is timed
    assert [(t.pid, t.seconds, t.relayed) for t in found] == [(1, 25.0, True), (2, 14.0, False)]
    assert figures(found, KILL).count == 1
    assert figures(found, KILL).relayed == 1


def test_a_nodes_log_gives_its_takes_and_releases(tmp_path: Path) -> None:
    # given a node's JSON log with a take, a release and other events
    path = tmp_path / "node.log"
    lines = [
        {"event": "fleet.took", "shard": "Ledgered:3", "timestamp": "2026-01-01T00:00:01Z"},
        {
            "event": "node.shard_released",
            "shard": "Ledgered[3]",
            "timestamp": "2026-01-01T00:00:02Z",
        },
        {"event": "fleet.took", "shard": "Other:1", "timestamp": "2026-01-01T00:00:03Z"},
        {"event": "job.retried", "shard": 3, "timestamp": "2026-01-01T00:00:04Z"},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    # when read
    holds = read_log(path, 42, "Ledgered")
    # then only the worker's take and release are kept, with their times
    assert holds.took == [(1767225601.0, 42, 3)]
    assert holds.released == [(1767225602.0, 42, 3)]
