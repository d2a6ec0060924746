"""A reshard with a node whose wall clock is 120 s ahead (Debian's libfaketime).

The node process runs with libfaketime preloaded (``FAKETIME=+120s``); the test
process announces the reshard and publishes. Nothing of the reshard compares the two
clocks: the node writes the switch once the trust window passed on its own clock,
closes the old shards, and every entity's jobs run in publish order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardq.ops import reshard
from shardq.ops.ensure import ensure_state_table
from tests.apps import ledger
from tests.children import ROOT, Env

# The library itself, not the ``faketime`` wrapper: the wrapper makes a named semaphore
# and shared memory per run and removes them only when it ends normally, so a wrapper
# stopped by a kill leaves them behind, and a later wrapper given the same pid fails
# ("sem_open: File exists") before the node starts.
LIBFAKETIME = next(
    iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))),
    None,
)
pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None,
    reason="needs Debian's libfaketime (apt-get install faketime) to skew a node's clock",
)

ENTITIES = 30


def test_a_node_whose_clock_is_120_s_ahead_finishes_a_reshard_in_order(
    env: Env, tmp_path: Path
) -> None:
    # given Ledgered (3 shards) with one job of each of 30 entities, a reshard to 5
    # announced, and a trust window of 6 s
    env.vars.update(SHARDQ_RESHARD_TRUST_SECONDS="6", SHARDQ_LAYOUT_REFRESH_SECONDS="0.5")
    # The ledger's 2 s visibility leaves a node 1 s to extend a held job: on an emulator
    # slowed by a loaded machine an extension can miss that, and the job is then run
    # twice (at least once). Clock skew is what this test is about: give it room.
    env.vars["SHARDQ_WORKERS__Ledgered__visibility_timeout"] = "10"
    app = ledger.app
    app.configure(env.config())
    ensure_state_table(app)
    app.ensure_queues()
    entities = [f"s{i}" for i in range(ENTITIES)]
    ledger.Ledgered.publish_many([(e, {"n": 0}) for e in entities])
    reshard.start(app, "Ledgered", 5)
    # when a node runs with its wall clock 120 s ahead (its output in a file: a pipe
    # nobody reads could fill up and block it)
    log = tmp_path / "node.log"
    started = time.time()
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "shardq", "run", "--node", "0"],
            cwd=ROOT,
            env={
                **os.environ,
                **env.vars,
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME": "+120s",
                # the wall clock only: a faked monotonic clock hangs every timed wait
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    env.children.append(child)
    try:
        # then it writes the switch (the trust window passed on its clock) ...
        env.wait_for(lambda: app.layouts.read("Ledgered").state != "announced", 60)
        # ... publishers that read it send to the new layout ...
        ledger.Ledgered.publish_many([(e, {"n": 1}) for e in entities])
        # ... and the old shards close once empty, the move ends
        env.wait_for(lambda: app.layouts.read("Ledgered").moving is None, 90)

        def ended() -> int:
            return len({e[1:3] for e in env.events() if e[0] == "end"})

        env.wait_for(lambda: ended() >= 2 * ENTITIES, 30)
    except AssertionError as exc:
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"{exc}\nthe node's output (exit {child.poll()}):\n{tail}") from exc
    finally:
        env.stop_all()
        # libfaketime leaves a semaphore and shared memory named by the pid behind
        for name in (f"sem.faketime_sem_{child.pid}", f"faketime_shm_{child.pid}"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"/dev/shm/{name}")
    # and every entity's jobs ran once each, in publish order, never two at once
    problems = ledger.check(ledger.read(env.ledger), dict.fromkeys(entities, 2))
    assert all(not found for found in problems.values()), problems
    assert app.layouts.read("Ledgered").shards == 5
    # and the node's clock was the skewed one: its log stamps read 2 minutes ahead
    first = json.loads(log.read_text().splitlines()[0])
    assert dt.datetime.fromisoformat(first["timestamp"]).timestamp() - started > 100, first
