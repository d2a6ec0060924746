"""shardq.ops.testing and the pytest plugin, used the way a user's test suite uses them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import shardq
from shardq.morgue import Morgue
from shardq.ops.testing import Harness, JobFailed, drain, eager, use_memory_broker

app = shardq.App(shardq.Config(broker_url="memory://"))
applied: list[tuple[str, Any]] = []
tries: dict[str, int] = {}


@app.register
class SyncOrder(shardq.Worker):
    shards = 4
    batch_size = 10
    max_retries = 2

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for p in payloads:
            tries[p["id"]] = tries.get(p["id"], 0) + 1
            if tries[p["id"]] <= p.get("fail", 0):
                raise RuntimeError(f"{p['id']} failed")
        applied.extend((entity_id, p["status"]) for p in payloads)
        if payloads[-1]["status"] == "paid":
            SendReceipt.publish(entity_id, {"order": entity_id})


@app.register
class SendReceipt(shardq.Worker):
    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        applied.append((entity_id, "receipt"))


@pytest.fixture(autouse=True)
def fresh() -> None:
    applied.clear()
    tries.clear()


def job(i: int, status: str, fail: int = 0) -> dict[str, Any]:
    return {"id": f"j{i}", "status": status, "fail": fail}


def test_drain_runs_every_job_in_order_with_retries(
    shardq_testing: Callable[[shardq.App], Harness],
) -> None:
    # given an app on an in-memory broker and jobs of two orders, one failing once
    harness = shardq_testing(app)
    SyncOrder.publish_many(
        [
            ("o1", job(1, "created")),
            ("o2", job(2, "created", fail=1)),
            ("o1", job(3, "paid")),
            ("o2", job(4, "paid")),
        ]
    )
    # when the queues are drained
    result = harness.drain()
    # then each order's updates ran in order, the failure was retried, receipts followed
    assert result.payloads("SyncOrder", "o1") == [job(1, "created"), job(3, "paid")]
    assert [p["status"] for p in result.payloads("SyncOrder", "o2")] == ["created", "paid"]
    # (batch_size 10: o2's two jobs ran in one perform call, so both were retried)
    retried = [(r.entity_id, r.payload["id"], type(r.error).__name__) for r in result.retried]
    assert retried == [("o2", "j2", "RuntimeError"), ("o2", "j4", "RuntimeError")]
    assert sorted(r.entity_id for r in result.succeeded if r.worker == "SendReceipt") == [
        "o1",
        "o2",
    ]
    assert [s for e, s in applied if e == "o2"] == ["created", "paid", "receipt"]


def test_drain_reports_jobs_that_reach_the_morgue(
    shardq_testing: Callable[[shardq.App], Harness],
) -> None:
    harness = shardq_testing(app)
    SyncOrder.publish("o1", job(1, "created", fail=99))
    result = harness.drain()
    assert [(r.entity_id, r.payload["id"]) for r in result.morgued] == [("o1", "j1")]
    assert len(result.retried) == 2  # max_retries
    assert Morgue(app, "SyncOrder").size() == 1


def test_eager_mode_runs_perform_inside_publish(
    shardq_testing: Callable[[shardq.App], Harness],
) -> None:
    harness = shardq_testing(app)
    with harness.eager():
        SyncOrder.publish("o1", job(1, "paid"))
        assert applied == [("o1", "paid"), ("o1", "receipt")]
        with pytest.raises(JobFailed, match="ended in the morgue: RuntimeError") as caught:
            SyncOrder.publish("o2", job(2, "paid", fail=99))
        assert isinstance(caught.value.error, RuntimeError)


def test_the_app_is_restored_after_an_override() -> None:
    before = app.config
    broker = shardq.MemoryBroker()
    with app.override(broker=broker):
        assert app.broker is broker
    assert app.config is before
    with pytest.raises(AssertionError):
        assert app._broker is broker


def test_helpers_work_without_the_fixture_too() -> None:
    other = shardq.App(shardq.Config(broker_url="memory://"))

    @other.register
    class Ping(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            applied.append((entity_id, "pong"))

    use_memory_broker(other)
    Ping.publish("d1", {})
    assert drain(other).payloads("Ping") == [{}]
    with eager(other):
        Ping.publish("d2", {})
    assert applied == [("d1", "pong"), ("d2", "pong")]


def test_a_drain_of_async_workers_leaves_no_event_loop_running() -> None:
    # given an app with an async worker, and the threads running before
    other = shardq.App(shardq.Config(broker_url="memory://"))

    @other.register
    class Fetch(shardq.Worker):
        async def perform(self, entity_id: str, payloads: list[Any]) -> None:
            applied.append((entity_id, "fetched"))

    use_memory_broker(other)
    before = set(threading.enumerate())
    # when its jobs are drained three times (as three tests would)
    for n in range(3):
        Fetch.publish(f"f{n}", {})
        drain(other)
    # then each drain's event loop thread ended with it (each one stayed, with its loop)
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:
        thread.join(timeout=10)
    assert applied == [("f0", "fetched"), ("f1", "fetched"), ("f2", "fetched")]
    assert [t.name for t in started if t.is_alive()] == []


def test_the_in_memory_broker_keeps_its_state_in_memory_even_with_a_store_url(
    shardq_testing: Callable[[shardq.App], Harness],
) -> None:
    # given an app configured for production, its state in a DynamoDB table elsewhere
    # (an endpoint nothing answers on, standing for the real one)
    prod = shardq.App(
        shardq.Config(
            broker_url="sqs://",
            region="eu-west-1",
            store_url="dynamodb://?endpoint_url=http://127.0.0.1:9&table=prod-state",
        )
    )

    @prod.register
    class Bill(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            applied.append((entity_id, "billed"))

    # when a test puts it on the in-memory broker, publishes and drains
    harness = shardq_testing(prod)
    Bill.publish("b1", {})
    harness.drain()
    # then the job ran, with the layouts, leases and dead jobs in memory too (the test
    # never reached for the production table)
    assert applied == [("b1", "billed")]
    assert prod.store.kind == "memory"


def test_payloads_can_be_selected_by_the_worker_class_as_by_its_name(
    shardq_testing: Callable[[shardq.App], Harness],
) -> None:
    # given a drain that ran jobs of two workers
    harness = shardq_testing(app)
    SyncOrder.publish("o1", job(1, "paid"))
    result = harness.drain()
    # when its payloads are selected by the worker class (as app.settings takes one)
    # then they are those selected by its name, not none at all
    assert result.payloads(SyncOrder) == result.payloads("SyncOrder") == [job(1, "paid")]
    assert result.payloads(SendReceipt, "o1") == [{"order": "o1"}]


def test_drain_runs_the_jobs_of_a_resharded_worker_in_its_live_generation() -> None:
    # given a worker resharded from 4 to 6 shards (its layout at generation 1), on memory
    from shardq.core.layout import WorkerLayout

    moved = shardq.App(shardq.Config(broker_url="memory://"))
    seen: list[tuple[str, int]] = []

    @moved.register
    class Moved(shardq.Worker):
        shards = 4

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            seen.extend((entity_id, p["n"]) for p in payloads)

    moved.layouts.update("Moved", lambda now: WorkerLayout(1, 6))
    # when jobs are published (into generation 1's queues) and drained
    Moved.publish_many([(f"e{n % 3}", {"n": n}) for n in range(9)])
    result = drain(moved)
    # then every job ran, in order per entity
    assert len(result.runs) == 9 and all(r.outcome == "succeeded" for r in result.runs)
    assert [n for e, n in seen if e == "e1"] == [1, 4, 7] and len(seen) == 9


def test_drain_stops_at_max_runs_even_while_one_job_retries() -> None:
    # given a job that fails every time, of a worker with a large max_retries
    other = shardq.App(shardq.Config(broker_url="memory://"))
    runs = [0]

    @other.register
    class Stubborn(shardq.Worker):
        max_retries = 5000

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            runs[0] += 1
            raise RuntimeError("no")

    use_memory_broker(other)
    Stubborn.publish("o1", {})
    # when the queues are drained with max_runs 20
    with pytest.raises(shardq.ShardqError, match="drain stopped after"):
        drain(other, max_runs=20)
    # then it stopped there, not after the job's 5,000 retries
    assert runs[0] <= 21
