"""Bad input, consolidated: what reaches a queue, the CLI, the config and the broker setup.

Covered elsewhere, not repeated here: invalid envelopes unit by unit
(test_envelope.py), bad messages before an in-process node starts (test_node.py),
entity ids one character class at a time (test_sharding.py) and in ``publish_many``
with oversize and non-JSON payloads (test_publish.py), broken YAML and invalid values
(test_config.py), bad ``plan`` flags and a broken config file for ``plan``
(test_node_process.py), bad ``publish``/``morgue`` arguments and an unreachable broker
for ``stats`` (test_cli_ops.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import shardq
from shardq import morgue
from shardq.broker import MemoryBroker, SendEntry
from shardq.core import envelope
from shardq.core.errors import EnvelopeError
from shardq.core.topology import shard_for
from shardq.morgue.migrate import move_queue_morgue
from tests import emulator as emu
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.children import ROOT, Env

#: 50,000 nested arrays: valid JSON that Python's decoder cannot descend into.
TOO_DEEP = "[" * 50_000 + "]" * 50_000


# -- bad messages in a queue while a node runs ----------------------------------------


@pytest.mark.slow
def test_bad_messages_go_to_the_morgue_while_the_node_keeps_running(env: Env) -> None:
    # given a node process that is running jobs
    node = env.node("--threads", "2")
    Ledgered.publish("warm-up", {"n": 0})
    env.wait_for(lambda: ("end", "warm-up", 0) in env.events())
    # when, between jobs 1 and 2 of entity "a" and beside entity "b"'s jobs, its
    # queue receives bodies no node can run
    Ledgered.publish_many([("a", {"n": 0}), ("a", {"n": 1}), ("b", {"n": 0})])
    queue = ledger.app.shard_queue("Ledgered", shard_for("a", 3))
    future = json.dumps({"v": 2, "worker": "Ledgered", "entity": "a", "payload": {"n": 9}})
    stranger = envelope.encode(envelope.Envelope("Gone", "a", {"n": 9}))
    bodies = {
        "not json at all": "not JSON",
        future: "version 2",
        '{"v": 1, "worker": "Ledgered"}': "no entity id",
        "[1, 2, 3]": "not a JSON object",
        "sig1:00:" + stranger: "signed but no signing key",
        TOO_DEEP: "nested too deeply",
        stranger: "no worker 'Gone' is registered",
    }
    result = ledger.app.broker.send_batch(
        queue, [SendEntry(str(i), body, "a", f"bad-{i}") for i, body in enumerate(bodies)]
    )
    assert result.failed == {}
    Ledgered.publish_many([("a", {"n": 2}), ("b", {"n": 1}), ("a", {"n": 3})])
    # then entity a's jobs 2 and 3 run after the bad messages, b's run too, in order
    env.wait_for(lambda: {("end", "a", 3), ("end", "b", 1)} <= set(env.events()))
    problems = ledger.check(ledger.read(env.ledger), {"a": 4, "b": 2, "warm-up": 1})
    assert not any(problems.values()), problems
    # and every bad message sits in the morgue, saying why, with its body untouched
    records = morgue.Morgue(ledger.app, "Ledgered").list_jobs()
    assert [r.body for r in records] == list(bodies)
    for record, why in zip(records, bodies.values(), strict=True):
        assert why in record.error_message, (record.error_message, why)
    assert {r.reason for r in records[:-1]} == {morgue.REASON_INVALID}
    assert records[-1].reason == morgue.REASON_UNKNOWN_WORKER
    # and the node is still up, and stops cleanly
    assert node.poll() is None
    node.send_signal(signal.SIGTERM)
    assert node.wait(30) == 0


def test_a_body_nested_too_deeply_is_an_envelope_error() -> None:
    # a RecursionError would escape the node's handling of invalid messages and
    # stop the lane, so each restart would die on the same message
    with pytest.raises(EnvelopeError, match="nested too deeply"):
        envelope.decode(TOO_DEEP)


def test_a_foreign_message_nested_too_deeply_in_an_old_morgue_queue_is_moved_as_unreadable() -> (
    None
):
    # given an old morgue queue holding a message shardq did not write, nested too deeply
    app = shardq.App(broker=MemoryBroker())

    @app.register
    class Job(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[object]) -> None: ...

    app.ensure_queues()
    app.ensure_queue(app.morgue_queue(Job), Job)  # as earlier versions made it
    app.broker.send_batch(app.morgue_queue(Job), [SendEntry("0", TOO_DEEP, "e", "d-0")])
    # when it is moved into the store and the morgue is listed
    assert move_queue_morgue(app, "Job") == 1
    (record,) = morgue.Morgue(app, "Job").list_jobs()
    # then it shows as an unreadable record, verbatim, with no payload
    assert (record.reason, record.entity_id, record.body) == ("unreadable_record", "e", TOO_DEEP)
    assert morgue.payload_of(record) is None
    assert morgue.requeue_problem(record) is not None


# -- the command line ------------------------------------------------------------------


def shardq_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardq", *args],
        cwd=ROOT,
        env={**os.environ, "SHARDQ_APP": "tests.apps.ledger", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("run", ["--node", "0", "--nodes", "0"], "--nodes must be at least 1, got 0"),
        ("run", ["--nodes", "2"], "--nodes needs --node"),
        ("run", ["--node", "3", "--nodes", "3"], "--node must be from 0 to 2"),
        ("run", ["--threads", "-1"], "threads: expected an integer from 1 to 256, got -1"),
        ("run", ["--grace-seconds", "-5"], "grace_seconds: expected 0 to 3600, got -5.0"),
        ("run", ["--metrics-port", "99999"], "metrics_port: expected a port from 0 to 65535"),
        ("run", ["--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
        ("run", ["--node", "abc"], "argument --node: invalid int value: 'abc'"),
        ("run", ["--app", "tests.apps"], "defines 0 shardq.App objects"),
        ("plan", ["--nodes", "0"], "--nodes must be at least 1, got 0"),
        ("plan", ["--node", "3", "--nodes", "3"], "--node must be from 0 to 2"),
    ],
)
def test_run_and_plan_refuse_bad_flag_values_before_touching_the_broker(
    tmp_path: Path, command: str, args: list[str], message: str
) -> None:
    # given a broker file that must not come to exist
    db = tmp_path / "never.db"
    # when a node is started, or the plan printed, with a bad flag
    result = shardq_cli(command, "--broker-url", f"sqlite:///{db}", *args)
    # then it exits 2 with the reason, having created nothing
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not db.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("threads: 2\n\tbroker_url: x\n", "not valid YAML"),
        ("workers:\n  Nope: {shards: 2}\n", "workers: Nope not registered (known: Ledgered)"),
        ("workers:\n  Ledgered: {shards: 0}\n", "shards"),
        ("workers:\n  Ledgered: {visibility_timeout: soon}\n", "visibility_timeout"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_run_with_a_broken_config_file_exits_2_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "shardq.yaml"
    config.write_text(text)
    result = shardq_cli("run", "--config", str(config), "--broker-url", "memory://")
    assert result.returncode == 2, result.stderr
    assert str(config) in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    ("entity", "message"),
    [
        ("", "has 0 characters; SQS group ids take 1 to 128"),
        ("x" * 129, "has 129 characters"),
        ("caf\u00e9", "contains '\u00e9'"),
        ("bell\x07", "contains '\\x07'"),
        ("tab\there", "contains '\\t'"),
    ],
)
def test_publish_refuses_an_entity_id_sqs_cannot_carry_and_sends_nothing(
    tmp_path: Path, entity: str, message: str
) -> None:
    broker = {"SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}"}
    result = shardq_cli("publish", "Ledgered", entity, '{"n": 0}', env=broker)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    stats = json.loads(shardq_cli("stats", "--json", env=broker).stdout)
    assert stats["total"]["length"] == 0


def test_an_oversize_payload_from_stdin_is_refused_and_nothing_is_sent(tmp_path: Path) -> None:
    broker = {"SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}"}
    payload = json.dumps({"n": 0, "blob": "x" * (1024 * 1024)})
    result = shardq_cli("publish", "Ledgered", "e", "-", env=broker, stdin=payload)
    assert result.returncode == 2, result.stderr
    assert "encodes to" in result.stderr and "accepts at most 1048576" in result.stderr
    stats = json.loads(shardq_cli("stats", "--json", env=broker).stdout)
    assert stats["total"]["length"] == 0


def test_an_embedded_broker_file_that_cannot_be_opened_exits_1_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "shardq.db"
    result = shardq_cli("run", "--until-empty", "--broker-url", f"sqlite:///{missing}")
    assert result.returncode == 1
    assert f"cannot open the embedded broker file {missing}" in result.stderr
    assert "Traceback" not in result.stderr


# -- AWS credentials and endpoints ------------------------------------------------------


def without_aws(**extra: str) -> dict[str, str]:
    """This environment with no AWS credentials anywhere boto3 would look."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/shardq-test/credentials",
        AWS_CONFIG_FILE="/nonexistent/shardq-test/config",
        AWS_EC2_METADATA_DISABLED="true",  # no instance-role lookup either
        SHARDQ_APP="tests.apps.ledger",
        **extra,
    )
    return env


SQS_BROKER_CALL = """
from shardq.broker.sqs import SqsBroker
from shardq.core.errors import BrokerError
broker = SqsBroker(region="us-east-1", endpoint_url={url!r})
try:
    broker.ensure_queue("creds.fifo")
except BrokerError as exc:
    print(exc)
"""


@pytest.mark.sqs
def test_without_aws_credentials_the_error_names_them(
    sqs_emulator: emu.Emulator, tmp_path: Path
) -> None:
    # given no AWS credentials in the environment or in ~/.aws
    env = without_aws(
        SHARDQ_BROKER_URL="sqs://",
        SHARDQ_ENDPOINT_URL=sqs_emulator.endpoint_url,
        SHARDQ_REGION="us-east-1",
        HOME=str(tmp_path),
    )
    # when an SqsBroker is used against the emulator
    code = SQS_BROKER_CALL.format(url=sqs_emulator.endpoint_url)
    direct = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    # then it raises a BrokerError that says credentials are missing and where they go
    assert direct.returncode == 0, direct.stderr
    assert "looking up queue creds.fifo: no AWS credentials found" in direct.stdout
    assert "never in shardq.yaml" in direct.stdout
    # and a node or a publish started like that exits 1 with the same reason
    for args in (["run", "--until-empty"], ["publish", "Ledgered", "e", '{"n": 0}']):
        result = subprocess.run(
            [sys.executable, "-m", "shardq", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stderr
        assert "no AWS credentials found" in result.stderr
        assert "cannot reach SQS" not in result.stderr


@pytest.mark.parametrize(
    ("aws", "reason"),
    [
        ({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE"}, "missing: AWS_SECRET_ACCESS_KEY"),
        ({"AWS_PROFILE": "no-such-profile"}, "The config profile (no-such-profile)"),
    ],
)
def test_aws_settings_boto3_cannot_load_are_an_error_not_a_traceback(
    aws: dict[str, str], reason: str
) -> None:
    # given half of a key pair in the environment, or a profile that does not exist
    env = without_aws(
        SHARDQ_BROKER_URL="sqs://",
        SHARDQ_ENDPOINT_URL="http://127.0.0.1:9",
        SHARDQ_REGION="us-east-1",
        **aws,
    )
    # when a node or a publish starts
    for args in (["run", "--until-empty"], ["publish", "Ledgered", "e", '{"n": 0}']):
        result = subprocess.run(
            [sys.executable, "-m", "shardq", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # then it exits 1 naming what boto3 could not load, with no traceback
        assert result.returncode == 1, result.stderr
        assert reason in result.stderr and "never in shardq.yaml" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_node_started_against_an_unreachable_endpoint_exits_1() -> None:
    # given an SQS endpoint where nothing listens (port 9, discard)
    env = {
        "SHARDQ_BROKER_URL": "sqs://",
        "SHARDQ_ENDPOINT_URL": "http://127.0.0.1:9",
        "SHARDQ_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    # when a node starts (boto3 retries each call a few times first)
    result = shardq_cli("run", "--until-empty", env=env)
    # then it exits 1 saying the broker cannot be reached, with no traceback
    assert result.returncode == 1
    # (the state table, on the same endpoint, is the first thing a node reads)
    assert "state store error: DynamoDB" in result.stderr or "broker error: looking up queue" in (
        result.stderr
    )
    assert "127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("spec", ["", ":app", ".workers", "workers.:app", " workers"])
def test_an_app_that_names_no_module_is_a_config_error(spec: str) -> None:
    # given --app (or SHARDQ_APP) empty, without a module, relative or with a space
    from shardq.core.errors import ConfigError
    from shardq.ops.cli import load_app

    # when the app is loaded
    # then it is refused naming it and the form (not a ValueError or TypeError traceback)
    with pytest.raises(ConfigError, match=r"is not MODULE\[:ATTR\]"):
        load_app(spec)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("import no_such_dependency_xyz\n", "ModuleNotFoundError: No module named"),
        ("import broken\n", "ModuleNotFoundError: No module named 'broken'"),
        ('raise RuntimeError("no DATABASE_URL")\n', "RuntimeError: no DATABASE_URL"),
        ("def broken(:\n", "SyntaxError: invalid syntax"),
    ],
)
def test_an_app_module_that_fails_to_import_exits_2_naming_the_error_and_the_line(
    tmp_path: Path, source: str, message: str
) -> None:
    # given an app module that cannot be imported: a missing dependency, an error at
    # import time, a syntax error
    (tmp_path / "brokenapp.py").write_text(source)
    path = os.pathsep.join([str(ROOT), str(tmp_path)])
    # when a command loads it
    result = shardq_cli("stats", env={"SHARDQ_APP": "brokenapp", "PYTHONPATH": path})
    # then it says which module failed, why and where, without a traceback, and exits 2
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "app module 'brokenapp' failed to import" in result.stderr
    assert message in result.stderr and "brokenapp.py" in result.stderr


@pytest.mark.parametrize(
    "command", [["run", "--until-empty"], ["stats"], ["nodes"], ["queues", "ensure"], ["dashboard"]]
)
def test_an_app_without_workers_is_refused_as_plan_refuses_it(
    tmp_path: Path, command: list[str]
) -> None:
    # given --app naming a module whose App has no worker (the workers live elsewhere)
    (tmp_path / "bareapp.py").write_text("import shardq\n\napp = shardq.App()\n")
    env = {
        "SHARDQ_APP": "bareapp",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}",
    }
    # when a command loads it
    result = shardq_cli(*command, env=env)
    # then it is refused, naming --app, as `shardq plan` does
    assert result.returncode == 2, result.stderr
    assert "no workers are registered; check --app" in result.stderr
