"""The morgue record: what a dead job's morgue message holds, and that it always fits."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import shardq
from shardq import envelope, morgue
from shardq.config import Config
from shardq.ensure import ensure_state_table
from shardq.node import Node
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[shardq.App]:
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    ledger.reset()
    broker = make_broker(request.param, tmp_path, request)
    ledger.app.configure(
        Config(queue_prefix=f"r{time.monotonic_ns() % 10**9}-", idle_wait_seconds=1),
        broker=broker,
    )
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield ledger.app
    broker.close()


def escape_heavy_payload(n: int, size: int) -> dict[str, object]:
    """A payload whose envelope is ~``size`` bytes and grows by half when escaped again."""
    return {"n": n, "permanent": True, "items": ["x"] * (size // 4)}


def test_a_big_job_that_fails_for_good_lands_in_the_morgue_once_with_its_body(
    app: shardq.App,
) -> None:
    # given a valid ~925 KB job that raises PermanentError, then a small job of its entity
    Ledgered.publish_many([("big", escape_heavy_payload(0, 925_000)), ("big", {"n": 1})])
    # when a node runs until the shards are empty
    node = Node(app, app.plan(threads=1), until_empty=True)
    runner = threading.Thread(target=node.run)
    runner.start()
    runner.join(60)
    if runner.is_alive():
        node.stop()
        runner.join(30)
        pytest.fail("the node never drained: the big job was retried instead of morgued")
    # then the big job ran once, sits in the morgue with its body intact, and the
    # entity moved on
    runs = [e["n"] for e in ledger.read(ledger.os.environ["LEDGER_PATH"]) if e["event"] == "start"]
    assert runs == [0, 1]
    (record,) = morgue.MorgueQueue(app, "Ledgered").list_jobs()
    assert record.reason == "permanent_error" and record.body_kept
    assert envelope.decode(record.body).payload == escape_heavy_payload(0, 925_000)


def message(body: str) -> shardq.broker.Message:
    return shardq.broker.Message(
        queue="q.fifo",
        body=body,
        receipt="r",
        message_id="m-1",
        group_id="e",
        receive_count=3,
        sent_at=1.0,
        sequence="1",
    )


def failure() -> shardq.PermanentError:
    try:
        raise shardq.PermanentError("broken " * 2000)
    except shardq.PermanentError as exc:
        return exc


@pytest.mark.parametrize("body_size", [100, 500_000, 1_040_000, 1_048_000, 1_048_576])
def test_an_entry_never_exceeds_the_limit_and_keeps_the_body_when_it_can(body_size: int) -> None:
    # given a dead job's body full of characters JSON escapes
    body = ('"\\\n' * body_size)[:body_size]
    record = morgue.record_for(message(body), morgue.REASON_PERMANENT, failure(), 3)
    limit = 1024 * 1024
    # when its morgue entry is made
    entry = morgue.entry(record, limit)
    # then it fits, and reads back with the body verbatim when there was room for it
    assert len(entry.body.encode("utf-8")) <= limit
    back = morgue.decode(entry.body)
    assert (back.entity_id, back.message_id, back.attempts) == ("e", "m-1", 3)
    assert back.body_bytes == body_size
    assert back.body_sha256 == hashlib.sha256(body.encode()).hexdigest()
    if body_size <= 1_040_000:
        assert back.body_kept and back.body == body
    if body_size == 1_048_576:
        assert not back.body_kept and back.body == ""
        assert "too large" in (morgue.requeue_problem(back) or "")


def test_a_record_written_in_the_first_format_still_reads() -> None:
    # given a morgue message in version 1: one JSON object, the body a string field
    old = json.dumps(
        {
            "kind": "shardq.morgue",
            "v": 1,
            "body": '{"v":1,"worker":"W","entity":"e","payload":{"n":1},"published_at":1}',
            "entity_id": "e",
            "reason": "max_retries",
            "error_type": "RuntimeError",
            "error_message": "boom",
            "traceback": "Traceback ...",
            "attempts": 4,
            "failed_at": 1_700_000_000.5,
            "source_queue": "w-0.fifo",
            "message_id": "m-1",
        }
    )
    # when it is read, then every field is there and the payload decodes
    record = morgue.decode(old)
    assert (record.reason, record.attempts, record.body_kept) == ("max_retries", 4, True)
    assert morgue.payload_of(record) == {"n": 1}
    assert morgue.requeue_problem(record) is None


def test_the_header_is_one_line_and_the_body_follows_verbatim() -> None:
    body = '{"v":1,"text":"line\\nbreak \\"quoted\\" caf\u00e9"}'
    entry = morgue.entry(morgue.record_for(message(body), "max_retries", failure(), 2), 4096)
    header, newline, rest = entry.body.partition("\n")
    assert newline and rest == body
    assert json.loads(header)["v"] == 2 and header.isascii()


@pytest.mark.parametrize("room", [3500, 1500])
def test_near_the_limit_the_traceback_then_the_message_are_trimmed_to_keep_the_body(
    room: int,
) -> None:
    # given a body that leaves ``room`` bytes for a header, less than its full size
    limit = 64 * 1024
    body = "x" * (limit - room)
    record = morgue.record_for(message(body), "max_retries", failure(), 2)
    assert len(record.error_message) == 2000 and len(record.traceback) > 2000
    # when its entry is made
    entry = morgue.entry(record, limit)
    # then it fills the limit at most, keeps the body, and marks what it trimmed: the
    # traceback first (keeping its end), then the message (keeping its start)
    assert len(entry.body.encode()) <= limit
    back = morgue.decode(entry.body)
    assert back.body == body
    if room == 3500:
        assert back.traceback.startswith("[trimmed to fit the morgue's size limit] ")
        assert back.traceback.endswith(record.traceback[-200:])
        assert back.error_message == record.error_message
    else:
        assert back.traceback == ""
        assert back.error_message.startswith("broken broken")
        assert back.error_message.endswith(" [trimmed to fit the morgue's size limit]")


def test_a_body_that_cannot_fit_is_recorded_without_it_and_logged() -> None:
    body = "y" * 2000
    record = morgue.record_for(message(body), "permanent_error", failure(), 1)
    with capture_logs() as logs:
        entry = morgue.entry(record, 1024)
    assert len(entry.body.encode()) <= 1024
    (event,) = [e for e in logs if e["event"] == "morgue.body_dropped"]
    assert (event["log_level"], event["body_bytes"], event["message_id"]) == ("error", 2000, "m-1")
    back = morgue.decode(entry.body)
    assert (back.body_kept, back.body, back.body_bytes) == (False, "", 2000)
    assert morgue.payload_of(back) is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"kind": "shardq.morgue", "v": 2}', "version 2"),
        ('{"kind": "shardq.morgue", "v": 9}\nbody', "version 9"),
        ('{"kind": "other"}', "not a shardq morgue record"),
        ("[" * 5000, "nested too deeply"),
    ],
)
def test_a_malformed_record_is_refused_saying_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        morgue.decode(text)


def test_a_record_whose_body_was_altered_is_refused() -> None:
    entry = morgue.entry(morgue.record_for(message('{"a":1}'), "max_retries", failure(), 1), 4096)
    with pytest.raises(ValueError, match="does not match its recorded size and SHA-256"):
        morgue.decode(entry.body.replace('{"a":1}', '{"a":2}'))
