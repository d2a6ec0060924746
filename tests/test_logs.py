"""Job outcome events: one per job, with the fields operators need, never the payload."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

import shardq
from shardq import logs
from shardq.node import Node


@pytest.fixture
def app() -> Iterator[shardq.App]:
    app = shardq.App(shardq.Config(broker_url="memory://", idle_wait_seconds=1))

    @app.register
    class Charge(shardq.Worker):
        shards = 2
        max_retries = 0

        def perform(self, entity_id: str, payloads: list[dict[str, str]]) -> None:
            if payloads[0]["card"] == "declined-4242":
                raise ValueError("card declined")

    yield app
    app.broker.close()


def test_each_job_outcome_is_one_event_with_its_context_and_no_payload(
    app: shardq.App,
) -> None:
    # given two jobs with secrets in their payloads, one of which fails for good
    charge = app.worker("Charge")
    charge.publish("acct-1", {"card": "secret-4111"})
    charge.publish("acct-2", {"card": "declined-4242"})
    # when a node runs them
    with capture_logs() as captured:
        Node(app, app.plan(threads=1), until_empty=True).run()
    # then there is one event per job, with worker, shard, entity, id, attempt, duration
    outcomes = [e for e in captured if e["event"].startswith("job.")]
    assert sorted((e["event"], e["entity"]) for e in outcomes) == [
        ("job.morgued", "acct-2"),
        ("job.succeeded", "acct-1"),
    ]
    for event in outcomes:
        assert {"worker", "shard", "entity", "message_id", "attempt", "duration"} <= set(event)
        assert event["worker"] == "Charge" and event["attempt"] == 1
    # and a success is a debug event, a job in the morgue a warning
    levels = {e["event"]: e["log_level"] for e in outcomes}
    assert levels == {"job.succeeded": "debug", "job.morgued": "warning"}
    # and no payload appears anywhere in the logs
    assert "secret-4111" not in repr(captured) and "declined-4242" not in repr(captured)
    # and the node logged its plan at start-up, one event per line of it
    plan = [e["line"] for e in captured if e["event"] == "node.plan"]
    assert any("Charge[0]" in line for line in plan) and not any("\n" in line for line in plan)


def test_json_format_writes_one_object_per_line() -> None:
    stream = io.StringIO()
    logs.configure("json", "info", stream)
    try:
        log = structlog.get_logger("test")
        log.info("job.succeeded", worker="W", entity="e-1")
        log.debug("hidden.below.level")
    finally:
        structlog.reset_defaults()
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "job.succeeded" and record["entity"] == "e-1"
    assert record["level"] == "info" and "timestamp" in record
