"""`shardq run` as a real child process: kill -9, SIGTERM, a second signal, the CLI."""

from __future__ import annotations

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


def test_a_node_killed_mid_batch_loses_nothing(env: Env) -> None:
    # given 6 entities with 5 slow jobs each, and a node processing them
    items = [(f"e{e}", {"n": n, "sleep": 0.2}) for n in range(5) for e in range(6)]
    Ledgered.publish_many(items)
    # (a static plan: the second node need not wait for the first one's leases)
    first = env.node("--node", "0", "--nodes", "1", "--threads", "3")
    env.wait_for(lambda: sum(1 for ev in env.events() if ev[0] == "end") >= 4)
    # when it is killed with SIGKILL in the middle of its batches
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # and another node runs until the queues are empty
    second = env.node("--node", "0", "--nodes", "1", "--threads", "3", "--until-empty")
    assert second.wait(90) == 0, second.stderr.read().decode()[-3000:] if second.stderr else ""
    # then every job succeeded in order per entity; only the killed node's jobs repeat
    problems = ledger.check(
        ledger.read(env.ledger), {f"e{e}": 5 for e in range(6)}, killed={first.pid}
    )
    assert problems["lost"] == [] and problems["order"] == []
    assert problems["overlap"] == [] and problems["bad_duplicates"] == []
    interrupted = [ev for ev in ledger.read(env.ledger) if ev["pid"] == first.pid]
    assert any(ev["event"] == "start" for ev in interrupted)


def test_sigterm_lets_the_running_job_finish_and_releases_the_rest(env: Env) -> None:
    # given an entity whose first job runs 2 s, and two jobs queued behind it
    Ledgered.publish_many([("e", {"n": 0, "sleep": 2.0}), ("e", {"n": 1}), ("e", {"n": 2})])
    node = env.node("--threads", "1")
    env.wait_for(lambda: ("start", "e", 0) in env.events())
    # when the node gets SIGTERM while job 0 runs
    node.send_signal(signal.SIGTERM)
    # then it exits 0 after job 0 finished, without starting jobs 1 and 2
    assert node.wait(30) == 0
    assert env.events() == [("start", "e", 0), ("end", "e", 0)]
    # and jobs 1 and 2 are visible again at once (released, not left in flight)
    queue = ledger.app.shard_queue("Ledgered", shardq.core.topology.shard_for("e", 3))
    counts = ledger.app.broker.counts(queue)
    assert (counts.waiting, counts.in_flight) == (2, 0)


def test_a_second_signal_exits_at_once(env: Env) -> None:
    # given a node running a 20 s job
    Ledgered.publish("e", {"n": 0, "sleep": 20.0})
    node = env.node("--threads", "1", "--grace-seconds", "60")
    env.wait_for(lambda: ("start", "e", 0) in env.events())
    # when it gets SIGTERM twice
    node.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    node.send_signal(signal.SIGTERM)
    # then it exits at once with 128 + SIGTERM, the job unfinished (it will come back)
    assert node.wait(10) == 128 + signal.SIGTERM
    assert ("end", "e", 0) not in env.events()


def run_cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardq", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_plan_prints_every_nodes_threads() -> None:
    result = run_cli("plan", "--app", "tests.apps.ledger", "--nodes", "2", "--threads", "2")
    assert result.returncode == 0, result.stderr
    assert "node 0 of 2: 2 shards" in result.stdout
    assert "node 1 of 2: 1 shards" in result.stdout
    assert "Ledgered[1]" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "--nodes", "2", "--node", "2"], "--node must be from 0 to 1"),
        (["plan", "--threads", "0"], "threads"),
        (["plan", "--app", "no_such_module"], "app module 'no_such_module' not found"),
        (["run", "--broker-url", "ftp://x", "--until-empty"], "broker_url"),
    ],
)
def test_bad_cli_values_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = run_cli(*args, "--app", "tests.apps.ledger") if "--app" not in args else run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_broken_config_file_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "shardq.yaml"
    bad.write_text("threads: [unclosed\n")
    result = run_cli("plan", "--app", "tests.apps.ledger", "--config", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "not valid YAML" in result.stderr


def test_main_returns_instead_of_exiting_on_help(capsys: pytest.CaptureFixture[str]) -> None:
    from shardq.ops.cli import main

    assert main(["run", "--help"]) == 0
    assert "--until-empty" in capsys.readouterr().out
    assert main(["run", "--no-such-flag"]) == 2


def queued(env: Env, entity: str = "e") -> tuple[int, int]:
    queue = ledger.app.shard_queue("Ledgered", shardq.core.topology.shard_for(entity, 3))
    counts = ledger.app.broker.counts(queue)
    return counts.waiting, counts.in_flight


@pytest.mark.parametrize("delay", [0.3, 0.6, 1.0, 1.5])
def test_a_sigterm_at_any_moment_of_start_up_exits_0_and_loses_nothing(
    env: Env, delay: float
) -> None:
    # given three queued jobs of an entity
    Ledgered.publish_many([("e", {"n": n}) for n in range(3)])
    # when a node gets SIGTERM while it starts up (or just after): ``delay`` s after
    # shardq's first lines ran (before them, Python itself is starting, which a
    # signal kills whatever shardq does; on a loaded machine that alone can take 0.5 s)
    node = env.node("--threads", "1")
    env.wait_until_catching(node, signal.SIGTERM)
    time.sleep(delay)
    node.send_signal(signal.SIGTERM)
    # then it exits 0 without a traceback
    assert node.wait(15) == 0
    stderr = node.stderr.read().decode() if node.stderr else ""
    assert "Traceback" not in stderr
    # and every job either ran to its end or is queued again, visible, none in flight
    done = sum(1 for ev in env.events() if ev[0] == "end")
    waiting, in_flight = queued(env)
    assert (done + waiting, in_flight) == (3, 0)


def test_an_idle_node_exits_promptly_on_sigterm_even_with_long_polls_waiting(env: Env) -> None:
    # given an idle node whose pollers wait 20 s per long poll
    env.vars["SHARDQ_IDLE_WAIT_SECONDS"] = "20"
    node = env.node("--threads", "2")

    def started() -> bool:
        try:
            return queued(env) == (0, 0)
        except shardq.QueueNotFoundError:
            return False

    env.wait_for(started)  # its queues exist
    time.sleep(1.0)
    # when it gets SIGTERM, then it exits 0 without waiting out its long polls
    node.send_signal(signal.SIGTERM)
    assert node.wait(10) == 0
    # and a job published afterwards is visible, not taken by an abandoned poll
    Ledgered.publish("e", {"n": 0})
    env.wait_for(lambda: queued(env) == (1, 0), timeout=5)
    assert env.events() == []


def test_until_empty_exits_soon_after_the_last_job(env: Env) -> None:
    # given five jobs and a node draining them with 20 s long polls
    env.vars["SHARDQ_IDLE_WAIT_SECONDS"] = "20"
    Ledgered.publish_many([(f"e{n}", {"n": 0}) for n in range(5)])
    # when it runs with --until-empty, then it exits 0 well before a long poll ends
    node = env.node("--threads", "2", "--until-empty")
    assert node.wait(15) == 0
    assert sorted(ev[1] for ev in env.events() if ev[0] == "end") == [f"e{n}" for n in range(5)]
