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
    queue = ledger.app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    counts = ledger.app.broker.counts(queue)
    assert (counts.waiting, counts.in_flight) == (2, 0)
    assert node.stderr is not None and b"SIGHUP" in node.stderr.read()


def published(env: Env) -> int:
    queues = [ledger.app.shard_queue("Ledgered", shard) for shard in range(3)]
    return sum(ledger.app.broker.counts(q).waiting for q in queues if exists(q))


def exists(queue: str) -> bool:
    try:
        ledger.app.broker.counts(queue)
    except shardq.core.errors.QueueNotFoundError:
        return False
    return True


def start_publishing(env: Env, tmp_path: Path, lines: int) -> subprocess.Popen[str]:
    jobs = tmp_path / "jobs.jsonl"
    with jobs.open("w") as out:
        for i in range(lines):
            out.write(json.dumps({"entity": f"e{i % 50}", "payload": {"n": i}}) + "\n")
    return subprocess.Popen(
        [sys.executable, "-m", "shardq", "publish", "Ledgered", "--file", str(jobs)],
        cwd=ROOT,
        env={**os.environ, **env.vars},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("stop", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143)],  # Ctrl-C; a stopped container, a killed CI job
    ids=["ctrl-c", "sigterm"],
)
def test_a_stopped_publish_file_names_the_last_line_published(
    env: Env, tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    # given `shardq publish --file` of 60,000 jobs, some of them already published
    total = 60_000
    child = start_publishing(env, tmp_path, total)
    deadline = time.monotonic() + 120
    while published(env) == 0 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # when it gets Ctrl-C (SIGINT) or SIGTERM
    child.send_signal(stop)
    _, stderr = child.communicate(timeout=120)
    # then it stops after the batch being sent and exits 128 + the signal's number
    # without a traceback, naming the last line published and the first not published,
    # and exactly those lines are in the queues
    assert child.returncode == code, stderr
    assert "Traceback" not in stderr
    count = published(env)
    assert 0 < count < total
    assert f"interrupted: published {count} of {total} jobs, the last on line {count}" in stderr
    assert f"({count + 1}-{total}), the first on line {count + 1}" in stderr


def test_a_second_ctrl_c_stops_at_once_naming_the_lines_in_doubt(env: Env, tmp_path: Path) -> None:
    # given `shardq publish --file` publishing
    child = start_publishing(env, tmp_path, 60_000)
    deadline = time.monotonic() + 120
    while published(env) == 0 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # when it gets Ctrl-C twice
    child.send_signal(signal.SIGINT)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    # then it still exits 130 without a traceback, saying what was published
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "shardq: interrupted: published " in stderr
