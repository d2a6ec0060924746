"""`shardq` child processes stopped by a hang-up or Ctrl-C stop cleanly and say what they did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardq
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.children import ROOT, Env

pytestmark = pytest.mark.slow


def test_sighup_is_a_graceful_stop_like_sigterm(env: Env) -> None:
    # given an entity whose first job runs 2 s, and two jobs queued behind it
    Ledgered.publish_many([("e", {"n": 0, "sleep": 2.0}), ("e", {"n": 1}), ("e", {"n": 2})])
    node = env.node("--threads", "1")
    env.wait_for(lambda: ("start", "e", 0) in env.events())
    # when the node's terminal hangs up while job 0 runs
    node.send_signal(signal.SIGHUP)
    # then it exits 0 after job 0 finished, without starting jobs 1 and 2
    assert node.wait(30) == 0
    assert env.events() == [("start", "e", 0), ("end", "e", 0)]
    # and jobs 1 and 2 are visible again at once (released, not left in flight)
    queue = ledger.app.shard_queue("Ledgered", shardq.sharding.shard_for("e", 3))
    counts = ledger.app.broker.counts(queue)
    assert (counts.waiting, counts.in_flight) == (2, 0)
    assert node.stderr is not None and b"SIGHUP" in node.stderr.read()
