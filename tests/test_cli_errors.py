"""Command-line failures end with a clear message and exit code, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import shardq
from tests.children import ROOT
from tests.test_bad_input import shardq_cli


def embedded(tmp_path: Path) -> dict[str, str]:
    return {"SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}"}


def test_a_metrics_port_in_use_exits_2_saying_so(tmp_path: Path) -> None:
    # given a port another process listens on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # when a node is started with its metrics there
        result = shardq_cli(
            "run", "--until-empty", "--metrics-port", str(port), env=embedded(tmp_path)
        )
    # then it exits 2 naming the port, with no traceback
    assert result.returncode == 2, result.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_endpoint_url_that_is_not_a_url_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "shardq.yaml"
    config.write_text("broker_url: sqs://\nendpoint_url: notaurl\n")
    result = shardq_cli("stats", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert str(config) in result.stderr
    assert "endpoint_url: expected an http:// or https:// URL" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[" * 1500 + "]" * 1500, "PAYLOAD_JSON is JSON nested too deeply"),
        ('{"n": NaN}', "NaN is not a JSON number"),
        ('{"n": -1e999}', "-1e999 is too large for a JSON number"),
        ('{"name": "\\ud800"}', "not valid Unicode"),
    ],
)
def test_publish_of_a_payload_json_cannot_carry_exits_2(
    tmp_path: Path, payload: str, message: str
) -> None:
    result = shardq_cli("publish", "Ledgered", "e", "-", stdin=payload, env=embedded(tmp_path))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_stats_into_a_closed_pipe_exit_quietly(tmp_path: Path) -> None:
    # given `shardq stats --json | head -0`: the reader is gone before anything is written
    child = subprocess.Popen(
        [sys.executable, "-m", "shardq", "stats", "--json"],
        cwd=ROOT,
        env={**os.environ, "SHARDQ_APP": "tests.apps.ledger", **embedded(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    # then it exits as a tool ended by SIGPIPE does, and prints nothing on stderr
    stderr = child.stderr.read().decode()
    assert child.wait(60) == 141
    assert stderr == ""


def test_publish_file_names_the_bad_lines_and_publishes_nothing(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"entity": "a", "payload": {"n": 0}}\n{"entity": "a", "pay": 1}\n')
    result = shardq_cli("publish", "Ledgered", "--file", str(jobs), env=embedded(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "1 line cannot be published, so nothing was" in result.stderr
    assert "line 2: unknown key 'pay'" in result.stderr
    stats = json.loads(shardq_cli("stats", "--json", env=embedded(tmp_path)).stdout)
    assert stats["total"]["length"] == 0


@pytest.mark.sqs
def test_an_unreachable_sqs_names_the_operation_and_only_speaks_of_jobs_where_jobs_are_involved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a queue made on an SQS endpoint where nothing listens any more
    from shardq.broker.sqs import SqsBroker
    from tests import emulator as emu

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    server = emu.start()
    try:
        broker = SqsBroker(region="us-east-1", endpoint_url=server.endpoint_url)
        broker.ensure_queue("q.fifo")
    finally:
        emu.stop(server)
    # when stats are read, then the error says what failed and nothing about a job
    with pytest.raises(shardq.BrokerError) as stats_error:
        broker.counts("q.fifo")
    assert "reading attributes of q.fifo: cannot reach SQS" in str(stats_error.value)
    assert "job" not in str(stats_error.value)
    # and when a receive fails, it says that queued jobs are not lost
    with pytest.raises(shardq.BrokerError) as receive_error:
        broker.receive("q.fifo", max_messages=1, wait_seconds=0, visibility_timeout=1)
    assert "queued jobs are not lost" in str(receive_error.value)


def test_publish_file_reads_stdin_given_a_dash(tmp_path: Path) -> None:
    # given two jobs on stdin
    lines = '{"entity": "a", "payload": {"n": 0}}\n{"entity": "b", "payload": {"n": 1}}\n'
    # when they are published with --file -
    result = shardq_cli("publish", "Ledgered", "--file", "-", stdin=lines, env=embedded(tmp_path))
    # then both are queued and the summary names stdin
    assert result.returncode == 0, result.stderr
    assert "published 2 Ledgered jobs from stdin" in result.stderr
    stats = json.loads(shardq_cli("stats", "--json", env=embedded(tmp_path)).stdout)
    assert stats["total"]["length"] == 2


def test_publish_file_that_cannot_be_read_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    result = shardq_cli("publish", "Ledgered", "--file", str(missing), env=embedded(tmp_path))
    assert result.returncode == 2, result.stderr
    assert f"cannot read {missing}: No such file or directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_abbreviated_flag_is_refused_not_guessed(tmp_path: Path) -> None:
    # when a purge is given the first letters of --all and --yes
    result = shardq_cli("morgue", "purge", "SyncOrder", "--al", "--ye", env=embedded(tmp_path))
    # then nothing is purged: the command exits 2 naming what it did not know
    assert result.returncode == 2, result.stderr
    assert "unrecognized arguments: --al --ye" in result.stderr


@pytest.mark.parametrize("value", ["[1, 2]", "not json", '{"gen": 1}'])
def test_a_node_refuses_a_damaged_layout_naming_the_item_the_worker_and_the_repair(
    tmp_path: Path, value: str
) -> None:
    # given an embedded app whose worker was resharded, and its layout item then damaged
    # by a hand edit
    env = embedded(tmp_path)
    resharded = shardq_cli("reshard", "Ledgered", "--shards", "4", "--no-wait", env=env)
    assert resharded.returncode == 0, resharded.stderr
    with sqlite3.connect(tmp_path / "b.db") as db:
        db.execute("UPDATE shardq_state SET value = ? WHERE key = 'layout/Ledgered'", (value,))
    # when a node starts
    result = shardq_cli("run", env=env)
    # then it guesses no layout: it exits non-zero, naming the item, the worker and what
    # to do (write the value back; deleting is only for a worker never resharded)
    assert result.returncode != 0, result.stderr
    assert "layout/Ledgered" in result.stderr and "layout of Ledgered" in result.stderr
    assert "write back" in result.stderr and "never resharded" in result.stderr
    assert "Traceback" not in result.stderr
