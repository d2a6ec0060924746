"""The morgue record: what a dead job's morgue message holds, and that it always fits."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardq
from shardq import envelope, morgue
from shardq.config import Config
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
    yield ledger.app
    broker.close()


def escape_heavy_payload(n: int, size: int) -> dict[str, object]:
    """A payload whose envelope is ~``size`` bytes and grows by half when escaped again."""
    return {"n": n, "permanent": True, "items": ["x"] * (size // 4)}


def test_a_big_job_that_fails_for_good_lands_in_the_morgue_once_with_its_body(
    app: shardq.App,
) -> None:
    # given a valid ~925 KB job that raises PermanentError, then a small job of its entity
    Ledgered.publish_many(
        [("big", escape_heavy_payload(0, 925_000)), ("big", {"n": 1})]
    )
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
