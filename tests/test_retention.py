"""Retention: queues keep messages 14 days, `queues ensure` reports a queue that keeps
them less and creates the DynamoDB state table, and a node warns (`job.old`) about a
job whose age passes a share of its queue's retention."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.broker import Broker, SendEntry, SqliteBroker
from shardq.broker.sqs import SqsBroker
from shardq.core.config import Config
from shardq.core.errors import ConfigError
from shardq.core.exits import EXIT_DRIFT, EXIT_OK
from shardq.core.limits import MAX_RETENTION_SECONDS
from shardq.ops.ensure import ensure
from shardq.run.intake import OldJobs, too_old
from tests.emulator import Emulator

DAY = 86400.0


@pytest.mark.parametrize(
    ("age", "retention", "share", "warn"),
    [
        (7 * DAY + 1, 14 * DAY, 0.5, True),
        (7 * DAY - 1, 14 * DAY, 0.5, False),
        (31.0, 60.0, 0.5, True),
        (13 * DAY, 14 * DAY, 0.0, False),  # 0 turns the warning off
        (400 * DAY, None, 0.5, False),  # the embedded broker keeps messages
        (61.0, 60.0, 1.0, True),
    ],
)
def test_too_old(age: float, retention: float | None, share: float, warn: bool) -> None:
    now = 1_800_000_000.0
    assert too_old(now - age, now, retention, share) is warn


def test_retention_warning_share_is_checked() -> None:
    with pytest.raises(ConfigError, match="retention_warning_share: expected 0 \\(off\\) to 1"):
        Config(retention_warning_share=1.5)
    with pytest.raises(ConfigError, match="retention_warning_share: expected a number"):
        Config.load(env={"SHARDQ_RETENTION_WARNING_SHARE": "half"})
    assert Config.load(env={"SHARDQ_RETENTION_WARNING_SHARE": "0"}).retention_warning_share == 0


def _sqs(server: Emulator) -> Any:
    from shardq.broker.sqs import SqsBroker

    return SqsBroker(region="us-east-1", endpoint_url=server.endpoint_url)


def _shorten_retention(broker: Any, queue: str, seconds: int) -> None:
    broker.client.set_queue_attributes(
        QueueUrl=broker.url(queue), Attributes={"MessageRetentionPeriod": str(seconds)}
    )


def _send_and_receive(broker: Broker, queue: str, count: int = 2) -> list[Any]:
    entries = [SendEntry(str(n), f"body{n}", f"g{n}", f"d{n}") for n in range(count)]
    assert not broker.send_batch(queue, entries).failed
    return broker.receive(queue, max_messages=10, wait_seconds=1, visibility_timeout=30)


@pytest.mark.sqs
def test_sqs_queues_are_created_with_the_longest_retention(sqs_emulator: Emulator) -> None:
    broker = _sqs(sqs_emulator)
    queue = f"r-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(queue)
    settings = broker.queue_settings(queue)
    assert settings is not None and settings.retention_seconds == MAX_RETENTION_SECONDS
    assert broker.retention_seconds(queue) == MAX_RETENTION_SECONDS == 1209600
    broker.close()


def test_the_embedded_broker_has_no_retention(tmp_path: Path) -> None:
    """Given a job received from the embedded broker, when it is a year old, then no
    warning: the embedded broker keeps messages until they are deleted."""
    broker = SqliteBroker(str(tmp_path / "broker.db"))
    broker.ensure_queue("q.fifo")
    settings = broker.queue_settings("q.fifo")
    assert settings is not None and settings.retention_seconds is None
    assert broker.retention_seconds("q.fifo") is None
    messages = _send_and_receive(broker, "q.fifo")
    with capture_logs() as logs:
        assert OldJobs(broker, 0.5, clock=lambda: time.time() + 365 * DAY).check(messages) == 0
    assert logs == []
    broker.close()


@pytest.mark.sqs
def test_sqs_reads_a_queues_size_limit_only_for_a_body_over_one_kib(
    sqs_emulator: Emulator,
) -> None:
    """Every SQS queue takes 1 KiB (the smallest MaximumMessageSize): sending and
    receiving bodies no larger costs no GetQueueAttributes; a larger body reads the
    limit once, and a body over it is refused alone."""
    # given an SQS queue that accepts at most 2 KiB
    broker = _sqs(sqs_emulator)
    queue = f"r-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(queue, max_message_bytes=2048)
    # when small jobs are sent, received and checked for age
    messages = _send_and_receive(broker, queue, count=3)
    OldJobs(broker, 0.5).check(messages)
    # then no queue attribute was read
    assert broker.requests["GetQueueAttributes"] == 0
    # when a 1,500-byte and a 3,000-byte body are sent together
    big = [SendEntry("a", "x" * 1500, "g1", "big-1"), SendEntry("b", "y" * 3000, "g2", "big-2")]
    result = broker.send_batch(queue, big)
    # then the limit was read once, and only the body over it was refused
    assert broker.requests["GetQueueAttributes"] == 1
    assert set(result.message_ids) == {"a"}
    assert result.failed == {"b": "message is 3000 bytes; the queue accepts at most 2048"}
    broker.close()


class _CountingRetention:
    """A broker part that answers the retention and counts how often it was asked."""

    def __init__(self, retention: int) -> None:
        self.retention, self.asked = retention, 0

    def retention_seconds(self, queue: str) -> int:
        self.asked += 1
        return self.retention


def test_jobs_younger_than_any_retention_cost_no_attribute_read(tmp_path: Path) -> None:
    """Given jobs received 29 s after they were sent (share 0.5 of the shortest retention,
    60 s, is 30 s), when they are checked, then the queue's retention is not read; at
    31 s it is read (once) and, on a 60 s queue, both are warned about."""
    broker = SqliteBroker(str(tmp_path / "broker.db"))
    broker.ensure_queue("q.fifo")
    messages = _send_and_receive(broker, "q.fifo")
    sent = min(m.sent_at for m in messages)
    asked = _CountingRetention(60)
    now = [sent + 29]
    old = OldJobs(asked, 0.5, clock=lambda: now[0])  # type: ignore[arg-type]
    assert old.check(messages) == 0
    assert asked.asked == 0
    now[0] = max(m.sent_at for m in messages) + 31
    with capture_logs():
        assert old.check(messages) == 2
    assert asked.asked == 1
    broker.close()


@pytest.mark.sqs
def test_old_jobs_are_warned_about_once_per_message(sqs_emulator: Emulator) -> None:
    """Given two jobs received from a queue keeping messages 60 s, when they are checked
    at 10 s and at 40 s of age (share 0.5: 30 s) and again, then each is warned about
    once, at 40 s."""
    broker = _sqs(sqs_emulator)
    queue = f"r-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(queue)
    _shorten_retention(broker, queue, 60)
    messages = _send_and_receive(broker, queue)
    assert len(messages) == 2
    sent = max(m.sent_at for m in messages)
    now = [sent + 10]
    old = OldJobs(broker, 0.5, clock=lambda: now[0])
    with capture_logs() as logs:
        assert old.check(messages) == 0
        now[0] = sent + 40
        assert old.check(messages) == 2
        assert old.check(messages) == 0
        assert OldJobs(broker, 0.0, clock=lambda: now[0]).check(messages) == 0  # off
    assert [e["event"] for e in logs] == ["job.old", "job.old"]
    assert {e["message_id"] for e in logs} == {m.message_id for m in messages}
    assert {(e["queue"], e["retention_seconds"], e["log_level"]) for e in logs} == {
        (queue, 60, "warning")
    }
    assert all(39 <= e["age_seconds"] <= 41 for e in logs)
    broker.close()


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


@pytest.fixture
def sqs_app(sqs_emulator: Emulator) -> Iterator[shardq.App]:
    broker = _sqs(sqs_emulator)
    config = Config(queue_prefix=f"r{uuid.uuid4().hex[:8]}-", idle_wait_seconds=1)
    app = shardq.App(config, broker=broker)
    app.register(type("Aged", (shardq.Worker,), {"perform": _perform, "shards": 2}))
    yield app
    broker.close()


@pytest.mark.sqs
def test_a_node_warns_about_a_job_near_its_queues_retention(sqs_app: shardq.App) -> None:
    """Given a job in a shard queue keeping messages 60 s, when a node whose clock reads
    40 s later receives it, then it logs job.old for it and still runs it."""
    assert ensure(sqs_app) == EXIT_OK
    worker = sqs_app.workers["Aged"]
    worker.publish("order-1", {"n": 1})
    for shard in range(2):
        _shorten_retention(sqs_app.broker, sqs_app.shard_queue("Aged", shard), 60)
    node = sqs_app.node(sqs_app.plan(threads=1), until_empty=True, seed=1)
    node.old_jobs.clock = lambda: time.time() + 40
    with capture_logs() as logs:
        runner = threading.Thread(target=node.run)
        runner.start()
        runner.join(60)
    assert not runner.is_alive()
    old = [e for e in logs if e["event"] == "job.old"]
    assert len(old) == 1 and old[0]["entity"] == "order-1"
    assert old[0]["retention_seconds"] == 60
    assert node.tally().succeeded["Aged"] == 1


@pytest.mark.sqs
def test_queues_ensure_creates_the_state_table_and_reports_retention_drift(
    sqs_app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given an sqs:// app with nothing created, when `queues ensure` runs, then its
    queues keep messages 14 days and its state table exists; when one queue's retention
    is then cut to 60 s, the next run reports it and exits 4."""
    assert ensure(sqs_app) == EXIT_OK
    out = capsys.readouterr().out
    table = f"{sqs_app.config.queue_prefix}shardq-state"
    assert f"state table {table} created (DynamoDB)" in out
    sqs_app.store.put("node/n1", {"beat": 1}, version=None)  # the table works
    queue = sqs_app.shard_queue("Aged", 1)
    found = sqs_app.broker.queue_settings(queue)
    assert found is not None and found.retention_seconds == MAX_RETENTION_SECONDS
    # (dead jobs live in the state table: no morgue queue is made)
    assert sqs_app.broker.queue_settings(sqs_app.morgue_queue("Aged")) is None
    _shorten_retention(sqs_app.broker, queue, 60)
    assert ensure(sqs_app) == EXIT_DRIFT
    out = capsys.readouterr().out
    assert f"state table {table} checked (DynamoDB)" in out
    assert f"drift: {queue}: MessageRetentionPeriod is 60 s, shardq sets 1209600 s" in out
    assert out.count("drift:") == 1
    item = sqs_app.store.get("node/n1")
    assert item is not None and item.value == {"beat": 1}


@pytest.mark.sqs
def test_queues_ensure_reports_a_redrive_policy_as_drift(
    sqs_app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given an app's queues, one of which was given a dead-letter queue after 3 receives
    (as infrastructure code often does), when `queues ensure` runs, then it reports that
    queue and exits 4: SQS would move a job retried or released 3 times out of its
    entity's order, past the morgue."""
    assert ensure(sqs_app) == EXIT_OK
    capsys.readouterr()
    queue = sqs_app.shard_queue("Aged", 0)
    broker = sqs_app.broker
    assert isinstance(broker, SqsBroker)
    broker.ensure_queue(dlq := f"{sqs_app.config.queue_prefix}dlq.fifo")
    arn = broker.client.get_queue_attributes(QueueUrl=broker.url(dlq), AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})
    broker.client.set_queue_attributes(
        QueueUrl=broker.url(queue), Attributes={"RedrivePolicy": policy}
    )
    assert ensure(sqs_app) == EXIT_DRIFT
    out = capsys.readouterr().out
    assert f"drift: {queue}: RedrivePolicy moves a job to {arn} after 3 receives" in out
    assert out.count("drift:") == 1
