"""A test app whose workers record every execution in a ledger file outside the broker.

Used by node tests in-process and by ``shardq run --app tests.apps.ledger`` in child
processes. The ledger path comes from ``LEDGER_PATH``; each line is JSON:
``{"event": "start"|"end"|"fail", "entity", "n", "pid", "t"}``.

Payload keys: ``n`` (job number within its entity), ``sleep`` (seconds),
``fail`` (attempts that fail before one succeeds), ``fail_rate`` (random failure
probability), ``permanent`` (always raise a permanent error).
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

import shardq

app = shardq.App()
_lock = threading.Lock()
_attempts: dict[tuple[str, int], int] = {}


def reset() -> None:
    """Forget the tries counted in this process (between tests)."""
    with _lock:
        _attempts.clear()


def record(event: str, entity: str, n: int) -> None:
    line = (
        json.dumps(
            {
                "event": event,
                "entity": entity,
                "n": n,
                "pid": os.getpid(),
                "tid": threading.get_ident(),
                "t": time.time(),
            }
        )
        + "\n"
    )
    fd = os.open(os.environ["LEDGER_PATH"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def run_job(entity: str, payload: dict[str, Any]) -> None:
    n = payload["n"]
    record("start", entity, n)
    try:
        if payload.get("sleep"):
            time.sleep(payload["sleep"])
        with _lock:
            tries = _attempts[(entity, n)] = _attempts.get((entity, n), 0) + 1
        if payload.get("permanent"):
            raise shardq.PermanentError(f"job {entity}#{n} is broken")
        if tries <= payload.get("fail", 0) or random.random() < payload.get("fail_rate", 0.0):
            raise RuntimeError(f"job {entity}#{n} failed on try {tries}")
    except BaseException:
        record("fail", entity, n)
        raise
    record("end", entity, n)


@app.register
class Ledgered(shardq.Worker):
    shards = 3
    visibility_timeout = 2
    max_retries = 50

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            run_job(entity_id, payload)

    def retry_in(self, attempt: int) -> float:
        return 0.05


def read(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(
    entries: list[dict[str, Any]],
    expected: dict[str, int],
    morgued: Collection[tuple[str, int]] = frozenset(),
    killed: Collection[int] | Mapping[int, float] = frozenset(),
) -> dict[str, list[Any]]:
    """What went wrong in a run, by kind; every list empty means a clean run.

    * lost: a job that neither succeeded nor sits in the morgue;
    * order: a job whose first success came after a later job's first success;
    * overlap: an execution of an entity that began while another was running;
    * duplicates: jobs that succeeded more than once (a node killed between running
      and deleting a batch replays its succeeded jobs, in order); bad_duplicates:
      those whose first success was not on a killed node.

    ``killed`` gives the pids of killed nodes, or maps each to the time (``time.time()``)
    it was known dead. An execution of a killed node that never ended stops counting
    as running at that time; with a plain set of pids, at once.
    """
    dead_at: dict[int, float] = (
        dict(killed) if isinstance(killed, Mapping) else dict.fromkeys(killed, -math.inf)
    )
    by_entity: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(entries, key=lambda e: e["t"]):
        by_entity.setdefault(e["entity"], []).append(e)
    problems: dict[str, list[Any]] = {
        "lost": [],
        "order": [],
        "overlap": [],
        "duplicates": [],
        "bad_duplicates": [],
    }
    for entity, count in expected.items():
        events = by_entity.get(entity, [])
        ended = [e["n"] for e in events if e["event"] == "end"]
        for n in range(count):
            if n not in ended and (entity, n) not in morgued:
                problems["lost"].append((entity, n))
        highest = -1
        for n in dict.fromkeys(ended):  # first successes; replays are judged as duplicates
            if n < highest:
                problems["order"].append((entity, n, "after", highest))
            highest = max(highest, n)
        running: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, thread) -> open start
        for e in events:
            key = (e["pid"], e["tid"])
            if e["event"] == "start":
                alive = [
                    s for (pid, _), s in running.items() if dead_at.get(pid, math.inf) > e["t"]
                ]
                if alive:
                    problems["overlap"].append((entity, e["n"], alive))
                running[key] = e
            else:
                running.pop(key, None)
        first_end: dict[int, dict[str, Any]] = {}
        for e in events:
            if e["event"] != "end":
                continue
            if e["n"] in first_end:
                problems["duplicates"].append((entity, e["n"]))
                if first_end[e["n"]]["pid"] not in dead_at:
                    problems["bad_duplicates"].append((entity, e["n"]))
            else:
                first_end[e["n"]] = e
    return problems
