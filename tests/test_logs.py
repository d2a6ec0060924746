"""Job outcome events: one per job, with the fields operators need, never the payload."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

import shardq
from shardq.ops import logs


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
        app.node(app.plan(threads=1), until_empty=True).run()
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


def test_a_running_node_logs_its_progress_now_and_then() -> None:
    # given a node that logs progress every 0.3 s, and jobs that take 1.5 s in all
    # (one at a time)
    app = shardq.App(shardq.Config(broker_url="memory://", progress_seconds=0.3, concurrency=1))

    @app.register
    class Slow(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[object]) -> None:
            time.sleep(0.05)

    Slow.publish_many([(f"e{n}", n) for n in range(30)])
    # when it runs them
    with capture_logs() as captured:
        app.node(app.plan(threads=1), until_empty=True).run()
    # then it logged node.progress at info, with jobs/s for the worker and the max lag
    progress = [e for e in captured if e["event"] == "node.progress"]
    assert len(progress) >= 2
    assert all(e["log_level"] == "info" for e in progress)
    assert any(e["jobs_per_second"].get("Slow", 0) > 0 for e in progress)
    assert {"done", "max_lag", "held"} <= set(progress[0])
    # and the slots in use out of its concurrency (one job at a time here)
    assert all(e["concurrency"] == 1 and e["slots_in_use"] in (0, 1) for e in progress)


def test_a_node_that_owns_no_shard_warns_and_says_why(app: shardq.App) -> None:
    # given five nodes for a worker of two shards, and this node is the fifth
    plan = app.plan(node=4, nodes=5, threads=1)
    assert plan.shards == []
    # when it runs
    with capture_logs() as captured:
        app.node(plan, until_empty=True).run()
    # then it warns that it owns no shard, and why
    (warning,) = [e for e in captured if e["event"] == "node.no_shards"]
    assert warning["log_level"] == "warning" and "more nodes than shards" in warning["detail"]


def test_a_job_that_exhausts_its_retries_is_morgued_at_warning_like_a_permanent_error(
    app: shardq.App,
) -> None:
    # given a worker with no retries whose job asks for a retry
    @app.register
    class Again(shardq.Worker):
        max_retries = 0

        def perform(self, entity_id: str, payloads: list[object]) -> None:
            raise shardq.Retry(delay=0)

    Again.publish("e", 1)
    # when a node runs it
    with capture_logs() as captured:
        app.node(app.plan(threads=1), until_empty=True).run()
    # then its trip to the morgue is a warning, as for any other job that died
    (morgued,) = [e for e in captured if e["event"] == "job.morgued"]
    assert morgued["log_level"] == "warning" and morgued["reason"] == "max_retries"
