"""Publishing through Worker.publish / Worker.publish_many on the embedded brokers."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.broker import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
)
from shardq.core import envelope
from shardq.core.errors import (
    BrokerError,
    DedupIdError,
    InvalidEntityIdError,
    PayloadError,
    PayloadTooLargeError,
    PublishError,
    QueueNotFoundError,
    UnknownWorkerError,
)
from shardq.core.layout import WorkerLayout, announce, switch
from shardq.core.limits import MAX_BATCH_BYTES, MAX_MESSAGE_BYTES
from shardq.core.topology import shard_for


class WrappingBroker(Broker):
    """Delegates to another broker and records every send_batch call."""

    kind = "wrapped"

    def __init__(self, inner: Broker) -> None:
        self.inner = inner
        self.batches: list[tuple[str, list[SendEntry]]] = []

    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        self.inner.ensure_queue(
            name, visibility_timeout=visibility_timeout, max_message_bytes=max_message_bytes
        )

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        self.batches.append((queue, list(entries)))
        return self.inner.send_batch(queue, entries)

    def queue_settings(self, queue: str) -> QueueSettings | None:
        return self.inner.queue_settings(queue)

    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        return self.inner.receive(
            queue,
            max_messages=max_messages,
            wait_seconds=wait_seconds,
            visibility_timeout=visibility_timeout,
        )

    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        return self.inner.delete_batch(queue, receipts)

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        return self.inner.change_visibility_batch(queue, changes)

    def counts(self, queue: str) -> QueueCounts:
        return self.inner.counts(queue)

    def max_message_bytes(self, queue: str) -> int:
        return self.inner.max_message_bytes(queue)

    def close(self) -> None:
        self.inner.close()


class RefusingBroker(WrappingBroker):
    """Refuses (per entry, as SQS may) every job whose payload is ``poison``; sends the rest."""

    REASON = "InternalError: simulated refusal"

    def __init__(self, inner: Broker, poison: Any) -> None:
        super().__init__(inner)
        self.poison = poison

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        self.batches.append((queue, list(entries)))
        refused = [e for e in entries if envelope.decode(e.body).payload == self.poison]
        rest = [e for e in entries if e not in refused]
        result = self.inner.send_batch(queue, rest) if rest else SendResult()
        for entry in refused:
            result.failed[entry.id] = self.REASON
        return result


class FailingFirstBatchBroker(WrappingBroker):
    """The first send_batch call fails whole (a network error); later ones go through."""

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        self.batches.append((queue, list(entries)))
        if len(self.batches) == 1:
            raise BrokerError("connection reset by peer")
        return self.inner.send_batch(queue, entries)


# -- fixtures and helpers -----------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def inner_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """An embedded broker: in memory, or on a SQLite file."""
    if request.param == "memory":
        instance: Broker = shardq.MemoryBroker()
    else:
        instance = shardq.SqliteBroker(str(tmp_path / "broker.db"))
    try:
        yield instance
    finally:
        instance.close()


def make_app(broker: Broker, **config: Any) -> shardq.App:
    return shardq.App(shardq.Config(**config), broker=broker)


@pytest.fixture
def app(inner_broker: Broker) -> shardq.App:
    return make_app(inner_broker)


def define(app: shardq.App, name: str = "SyncOrder", **attrs: Any) -> type[shardq.Worker]:
    def perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
        return None

    return app.register(type(name, (shardq.Worker,), {"perform": perform, **attrs}))


def queue_of(app: shardq.App, worker: type[shardq.Worker], entity: str) -> str:
    return app.shard_queue(worker, shard_for(entity, app.settings(worker).shards))


def drain(app: shardq.App, queue: str, key: bytes | None = None) -> list[envelope.Envelope]:
    """Every job waiting in ``queue``, in the order the broker hands them out."""
    jobs: list[envelope.Envelope] = []
    while batch := app.broker.receive(
        queue, max_messages=10, wait_seconds=0, visibility_timeout=60
    ):
        jobs += [envelope.decode(m.body, key) for m in batch]
        assert not app.broker.delete_batch(queue, [m.receipt for m in batch]).failed
    return jobs


def drain_all(app: shardq.App, worker: type[shardq.Worker]) -> list[envelope.Envelope]:
    jobs: list[envelope.Envelope] = []
    for shard in range(app.settings(worker).shards):
        queue = app.shard_queue(worker, shard)
        with contextlib.suppress(QueueNotFoundError):
            jobs += drain(app, queue)
    return jobs


def payloads_by_entity(jobs: list[envelope.Envelope]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for job in jobs:
        out.setdefault(job.entity, []).append(job.payload)
    return out


def waiting(app: shardq.App, worker: type[shardq.Worker]) -> int:
    """Jobs waiting over all shard queues of ``worker`` (a missing queue holds none)."""
    total = 0
    for shard in range(app.settings(worker).shards):
        with contextlib.suppress(QueueNotFoundError):
            total += app.broker.counts(app.shard_queue(worker, shard)).waiting
    return total


# -- where jobs land -------------------------------------------------------------------


def test_a_published_job_lands_in_its_entitys_shard_queue(app: shardq.App) -> None:
    # given a worker with 8 shards
    worker = define(app, shards=8)
    # when one job is published
    message_id = worker.publish("order-42", {"total": 10}, meta={"trace": "t1"})
    # then it waits in the shard queue of its entity, and nowhere else
    queue = queue_of(app, worker, "order-42")
    assert queue == f"sync-order-{shard_for('order-42', 8)}.fifo"
    jobs = drain(app, queue)
    assert len(jobs) == 1
    assert (jobs[0].worker, jobs[0].entity) == ("SyncOrder", "order-42")
    assert jobs[0].payload == {"total": 10}
    assert jobs[0].meta == {"trace": "t1"}
    assert isinstance(message_id, str) and message_id
    assert waiting(app, worker) == 0


def test_the_message_group_is_the_entity_id(app: shardq.App) -> None:
    worker = define(app, shards=2)
    worker.publish("cust:7", 1)
    queue = queue_of(app, worker, "cust:7")
    [message] = app.broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    assert message.group_id == "cust:7"


def test_the_shard_count_and_prefix_of_the_config_decide_the_queue(inner_broker: Broker) -> None:
    # given a config that changes a worker's shards and adds a prefix
    app = make_app(inner_broker, queue_prefix="prod-", workers={"SyncOrder": {"shards": 3}})
    worker = define(app, shards=8)
    # when jobs are published
    entities = [f"e{i}" for i in range(12)]
    worker.publish_many([(e, e) for e in entities])
    # then each lands in prod-sync-order-<shard over 3>.fifo
    for e in entities:
        queue = f"prod-sync-order-{shard_for(e, 3)}.fifo"
        assert queue == queue_of(app, worker, e)
    landed = {
        job.entity: shard
        for shard in range(3)
        for job in drain(app, f"prod-sync-order-{shard}.fifo")
    }
    assert landed == {e: shard_for(e, 3) for e in entities}


def test_jobs_of_each_entity_arrive_in_publish_order(app: shardq.App) -> None:
    # given jobs of five entities, interleaved, over four shards
    worker = define(app, shards=4)
    entities = [f"cust-{i}" for i in range(5)]
    items = [(e, {"n": n}) for n in range(14) for e in entities]
    # when they are published in one call
    report = worker.publish_many(items)
    # then every job was sent, and each entity's jobs come back in publish order
    assert report.sent == len(items)
    assert report.failed == []
    jobs = drain_all(app, worker)
    assert payloads_by_entity(jobs) == {e: [{"n": n} for n in range(14)] for e in entities}


def test_consecutive_publish_calls_keep_the_entitys_order(app: shardq.App) -> None:
    worker = define(app, shards=2)
    for n in range(12):
        worker.publish("e1", n)
    assert [j.payload for j in drain(app, queue_of(app, worker, "e1"))] == list(range(12))


def test_the_report_gives_each_items_message_id_in_item_order(app: shardq.App) -> None:
    # given items of several entities and shards
    worker = define(app, shards=4)
    items = [(f"e{i % 3}", i) for i in range(9)]
    # when they are published
    report = worker.publish_many(items)
    # then message_ids[i] is the id of item i
    assert len(report.message_ids) == 9
    assert len(set(report.message_ids)) == 9
    by_id: dict[str, Any] = {}
    for queue in {queue_of(app, worker, e) for e, _ in items}:
        for m in app.broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30):
            by_id[m.message_id] = envelope.decode(m.body).payload
    assert [by_id[m] for m in report.message_ids if m is not None] == list(range(9))


def test_publish_many_of_nothing_sends_nothing(app: shardq.App) -> None:
    worker = define(app)
    report = worker.publish_many([])
    assert report.message_ids == []
    assert report.sent == 0
    assert waiting(app, worker) == 0


def test_publish_many_takes_any_iterable(app: shardq.App) -> None:
    worker = define(app)
    report = worker.publish_many(("e", n) for n in range(3))
    assert report.sent == 3
    assert [j.payload for j in drain(app, queue_of(app, worker, "e"))] == [0, 1, 2]


def test_bodies_are_signed_when_the_app_has_a_signing_key(inner_broker: Broker) -> None:
    # given an app with a signing key
    app = make_app(inner_broker, signing_key="s3cret")
    worker = define(app)
    # when a job is published
    worker.publish("e1", {"a": 1})
    # then its body is signed with that key
    queue = queue_of(app, worker, "e1")
    [message] = app.broker.receive(queue, max_messages=1, wait_seconds=0, visibility_timeout=30)
    assert message.body.startswith("sig1:")
    assert envelope.decode(message.body, b"s3cret").payload == {"a": 1}


# -- item forms ---------------------------------------------------------------------------


def test_jobs_and_tuples_of_two_or_three_are_accepted(app: shardq.App) -> None:
    # given a Job, a pair and a triple with a dedup id
    worker = define(app)
    items = [
        shardq.Job("e1", "job", meta={"source": "api"}),
        ("e1", "pair"),
        ("e1", "triple", "dedup-1"),
        ("e1", "triple-none", None),
    ]
    # when they are published
    report = worker.publish_many(items)
    # then all of them are sent in order, with the Job's meta
    assert report.sent == 4
    jobs = drain(app, queue_of(app, worker, "e1"))
    assert [j.payload for j in jobs] == ["job", "pair", "triple", "triple-none"]
    assert jobs[0].meta == {"source": "api"}
    assert jobs[1].meta == {}


@pytest.mark.parametrize(
    ("item", "type_name"),
    [
        (["e1", "payload"], "list"),
        ({"entity_id": "e1", "payload": 1}, "dict"),
        ("e1", "str"),
        (("e1",), "tuple"),
        (("e1", 1, "d", {"meta": 1}), "tuple"),
        (None, "NoneType"),
    ],
)
def test_other_item_types_raise_type_error_naming_the_index(
    app: shardq.App, item: Any, type_name: str
) -> None:
    # given a valid item followed by an item of another type
    worker = define(app)
    # when they are published
    with pytest.raises(TypeError) as caught:
        worker.publish_many([("e1", "ok"), item])
    # then the error names the item's index and type, and nothing is sent
    message = str(caught.value)
    assert message.startswith("item 1: expected shardq.Job")
    assert f"got {type_name}" in message
    assert waiting(app, worker) == 0


# -- invalid jobs: nothing is sent -----------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["", "has space", "caf\u00e9", "x" * 129, 42, "nl\n"])
def test_an_invalid_entity_id_sends_nothing_and_names_the_item(
    app: shardq.App, bad_id: Any
) -> None:
    # given valid jobs and one with an invalid entity id at index 2
    worker = define(app, shards=4)
    items = [("e1", 1), ("e2", 2), (bad_id, 3), ("e3", 4)]
    # when they are published
    with pytest.raises(InvalidEntityIdError) as caught:
        worker.publish_many(items)
    # then the error names the item, and no job at all was sent
    assert str(caught.value).startswith("item 2: entity id")
    assert waiting(app, worker) == 0


def test_a_payload_that_is_not_json_sends_nothing_and_names_the_item(app: shardq.App) -> None:
    worker = define(app, shards=4)
    items = [("e1", 1), ("e2", {"when": object()}), ("e3", 3)]
    with pytest.raises(PayloadError) as caught:
        worker.publish_many(items)
    message = str(caught.value)
    assert message.startswith("item 1: ")
    assert "entity 'e2'" in message
    assert waiting(app, worker) == 0


def test_a_payload_with_a_key_that_is_not_a_string_sends_nothing_and_names_it(
    app: shardq.App,
) -> None:
    # given a batch whose second job has {1: "a", "1": "b"} nested in its payload
    worker = define(app, shards=4)
    items = [("e1", {"1": "x"}), ("e2", {"lines": [{1: "a", "1": "b"}]}), ("e3", 3)]
    # when it is published, then nothing is sent and the item, entity and path are named
    with pytest.raises(PayloadError, match=r"^item 1: .*entity 'e2'.*payload\['lines'\]\[0\]"):
        worker.publish_many(items)
    assert waiting(app, worker) == 0


def test_a_nan_payload_sends_nothing(app: shardq.App) -> None:
    worker = define(app)
    with pytest.raises(PayloadError, match=r"^item 0: "):
        worker.publish_many([("e1", float("nan")), ("e1", 1)])
    assert waiting(app, worker) == 0


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "meta", "problem"),
    [
        (nested(1500), None, "nested too deeply"),
        ({"name": "\ud800"}, None, "not valid Unicode"),
        (1, {"trace": "\udfff"}, "not valid Unicode"),
    ],
)
def test_a_deep_or_invalid_unicode_payload_is_a_payload_error_and_sends_nothing(
    app: shardq.App, payload: Any, meta: Any, problem: str
) -> None:
    worker = define(app)
    with pytest.raises(PayloadError, match=problem):
        worker.publish("e1", payload, meta=meta)
    with pytest.raises(PayloadError, match=f"^item 1: .*{problem}"):
        worker.publish_many([("e1", 1), shardq.Job("e1", payload, meta=meta)])
    assert waiting(app, worker) == 0


@pytest.mark.parametrize("meta", [["trace", "t1"], "trace=t1", [("trace", "t1")]])
def test_meta_that_is_not_a_mapping_is_a_payload_error_naming_the_item(
    app: shardq.App, meta: Any
) -> None:
    # given meta that is not a mapping (a list, a string, pairs) / when published
    worker = define(app)
    with pytest.raises(PayloadError, match=r"^meta for entity 'e1' of SyncOrder must be"):
        worker.publish("e1", 1, meta=meta)
    with pytest.raises(PayloadError, match=r"^item 1: meta for entity 'e1'"):
        worker.publish_many([("e1", 1), shardq.Job("e1", 2, meta=meta)])
    # then it is refused as any bad payload is, and nothing is sent
    assert waiting(app, worker) == 0


@pytest.mark.parametrize("dedup_id", ["\ud800", "", 42])
def test_a_dedup_id_that_is_not_a_valid_string_is_refused(app: shardq.App, dedup_id: Any) -> None:
    worker = define(app)
    with pytest.raises(DedupIdError, match="dedup_id"):
        worker.publish("e1", 1, dedup_id=dedup_id)
    assert waiting(app, worker) == 0


def test_single_publish_of_an_invalid_job_raises_the_same_errors(app: shardq.App) -> None:
    worker = define(app)
    # (a single job is not called "item 0": there is only one)
    with pytest.raises(InvalidEntityIdError, match=r"^entity id 'bad id' contains ' '"):
        worker.publish("bad id", 1)
    with pytest.raises(PayloadError, match=r"^payload or meta for entity 'e1'"):
        worker.publish("e1", {1, 2})
    assert waiting(app, worker) == 0


def test_a_job_over_the_queues_size_limit_sends_nothing(app: shardq.App) -> None:
    # given a shard queue that accepts at most 1 KiB, created before publishing
    worker = define(app)
    queue = app.shard_queue(worker, 0)
    app.broker.ensure_queue(queue, max_message_bytes=1024)
    # when a small job, a 2 KB job and another small job are published
    items = [("e1", "small"), ("e2", "x" * 2000), ("e3", "small")]
    with pytest.raises(PayloadTooLargeError) as caught:
        worker.publish_many(items)
    # then the error names the item, its size and the limit, and nothing is sent
    message = str(caught.value)
    assert message.startswith("item 1: job for entity 'e2' of SyncOrder encodes to ")
    assert f"queue {queue} accepts at most 1024" in message
    assert "S3" in message
    assert waiting(app, worker) == 0
    # and a job under the limit still goes through
    worker.publish("e1", "small")
    assert [j.payload for j in drain(app, queue)] == ["small"]


class LimitCountingBroker(WrappingBroker):
    """Counts the reads of a queue's size limit."""

    def __init__(self, inner: Broker) -> None:
        super().__init__(inner)
        self.limit_reads: list[str] = []

    def max_message_bytes(self, queue: str) -> int:
        self.limit_reads.append(queue)
        return super().max_message_bytes(queue)


def test_a_queues_size_limit_is_read_only_for_a_job_over_one_kib(inner_broker: Broker) -> None:
    """Every queue takes 1 KiB (the smallest MaximumMessageSize SQS allows): jobs no larger
    cost no attribute read; a larger one reads its queue's limit once."""
    # given a publisher on a broker counting the size-limit reads
    broker = LimitCountingBroker(inner_broker)
    app = make_app(broker)
    worker = define(app, shards=1)
    # when 50 small jobs are published
    worker.publish_many([(f"e{n}", {"n": n}) for n in range(50)])
    # then no limit was read
    assert broker.limit_reads == []
    # when two jobs over 1 KiB are published
    worker.publish_many([("e1", "x" * 2000), ("e2", "y" * 2000)])
    # then the queue's limit was read once, and every job is there
    assert broker.limit_reads == [app.shard_queue(worker, 0)]
    assert waiting(app, worker) == 52


def test_a_job_over_one_mib_is_too_large_for_a_default_queue(app: shardq.App) -> None:
    worker = define(app)
    with pytest.raises(PayloadTooLargeError, match=f"accepts at most {MAX_MESSAGE_BYTES}"):
        worker.publish("e1", "x" * MAX_MESSAGE_BYTES)
    assert waiting(app, worker) == 0


def test_payload_too_large_is_a_payload_error(app: shardq.App) -> None:
    worker = define(app)
    with pytest.raises(PayloadError):
        worker.publish("e1", "x" * MAX_MESSAGE_BYTES)


# -- deduplication --------------------------------------------------------------------------


def test_a_second_publish_with_the_same_dedup_id_is_a_no_op(app: shardq.App) -> None:
    # given a job published with a dedup id
    worker = define(app)
    first = worker.publish("e1", "v1", dedup_id="order-created")
    # when the same entity publishes with the same dedup id again (another payload even)
    second = worker.publish("e1", "v2", dedup_id="order-created")
    # then the second publish is accepted but nothing new is queued
    assert second == first
    assert [j.payload for j in drain(app, queue_of(app, worker, "e1"))] == ["v1"]


def test_the_same_dedup_id_on_another_entity_is_still_sent(app: shardq.App) -> None:
    # given two entities in the same shard queue
    worker = define(app, shards=1)
    worker.publish("e1", "for e1", dedup_id="d1")
    # when another entity publishes with the same dedup id
    worker.publish("e2", "for e2", dedup_id="d1")
    # then both jobs are queued
    jobs = drain(app, app.shard_queue(worker, 0))
    assert payloads_by_entity(jobs) == {"e1": ["for e1"], "e2": ["for e2"]}


def test_dedup_ids_work_within_one_publish_many(app: shardq.App) -> None:
    worker = define(app, shards=1)
    report = worker.publish_many(
        [("e1", "a", "d1"), ("e1", "b", "d1"), ("e2", "c", "d1"), ("e1", "d", "d2")]
    )
    assert report.sent == 4
    assert report.message_ids[0] == report.message_ids[1]
    jobs = drain(app, app.shard_queue(worker, 0))
    assert payloads_by_entity(jobs) == {"e1": ["a", "d"], "e2": ["c"]}


def test_jobs_without_a_dedup_id_are_never_deduplicated(app: shardq.App) -> None:
    worker = define(app)
    worker.publish("e1", "same")
    worker.publish("e1", "same")
    assert [j.payload for j in drain(app, queue_of(app, worker, "e1"))] == ["same", "same"]


# -- batching -------------------------------------------------------------------------------


def test_publish_many_sends_at_most_ten_jobs_per_batch(inner_broker: Broker) -> None:
    # given a recording broker and a worker with one shard
    broker = WrappingBroker(inner_broker)
    app = make_app(broker)
    worker = define(app)
    # when 25 jobs are published
    report = worker.publish_many([(f"e{i % 4}", i) for i in range(25)])
    # then they go in batches of 10, 10 and 5, and all arrive in order
    assert [len(entries) for _, entries in broker.batches] == [10, 10, 5]
    assert report.sent == 25
    jobs = drain(app, app.shard_queue(worker, 0))
    assert [j.payload for j in jobs] == list(range(25))


def test_batches_never_mix_shard_queues(inner_broker: Broker) -> None:
    broker = WrappingBroker(inner_broker)
    app = make_app(broker)
    worker = define(app, shards=4)
    worker.publish_many([(f"e{i}", i) for i in range(40)])
    for queue, entries in broker.batches:
        assert 1 <= len(entries) <= 10
        assert {queue_of(app, worker, e.group_id) for e in entries} == {queue}
    assert sum(len(entries) for _, entries in broker.batches) == 40


def test_publish_many_keeps_each_batch_within_one_mib(inner_broker: Broker) -> None:
    # given a recording broker and three ~400 KiB jobs for one entity (one shard queue)
    broker = WrappingBroker(inner_broker)
    app = make_app(broker)
    worker = define(app, shards=4)
    items = [("big", f"{n}" + "x" * (400 * 1024)) for n in range(3)]
    # when they are published together
    report = worker.publish_many(items)
    # then they go in two batches, two then one, each within 1 MiB
    sizes = [[len(e.body.encode()) for e in entries] for _, entries in broker.batches]
    assert [len(s) for s in sizes] == [2, 1]
    assert all(sum(s) <= MAX_BATCH_BYTES for s in sizes)
    # and all three arrive, in order
    assert report.sent == 3
    jobs = drain(app, queue_of(app, worker, "big"))
    assert [j.payload[0] for j in jobs] == ["0", "1", "2"]


# -- broker failures ----------------------------------------------------------------------------


def test_a_refused_job_is_reported_and_later_jobs_of_its_entity_are_held_back(
    inner_broker: Broker,
) -> None:
    # given a broker that refuses the job whose payload is "poison"
    broker = RefusingBroker(inner_broker, poison="poison")
    app = make_app(broker)
    worker = define(app)
    # and 14 jobs: entity A's second job is refused in the first batch of 10,
    # A has two more jobs in the second batch, B and C have jobs in both
    items = [
        ("A", "a0"), ("B", "b0"), ("A", "poison"), ("B", "b1"), ("C", "c0"),
        ("B", "b2"), ("C", "c1"), ("B", "b3"), ("C", "c2"), ("B", "b4"),
        ("A", "a2"), ("B", "b5"), ("A", "a3"), ("C", "c3"),
    ]  # fmt: skip
    # when they are published
    with pytest.raises(PublishError) as caught:
        worker.publish_many(items)
    # then the error lists the refused job with the broker's reason, and A's later jobs
    error = caught.value
    assert error.failed[0] == (2, "A", RefusingBroker.REASON)
    assert [(i, e) for i, e, _ in error.failed] == [(2, "A"), (10, "A"), (12, "A")]
    assert all("earlier job of this entity" in reason for _, _, reason in error.failed[1:])
    assert error.sent == 11
    assert "3 of 14 SyncOrder jobs were not published" in str(error)
    assert "item 2, entity 'A'" in str(error)
    # and A's later jobs were not sent (its order is kept), while B and C were all sent
    jobs = drain(app, app.shard_queue(worker, 0))
    assert payloads_by_entity(jobs) == {
        "A": ["a0"],
        "B": ["b0", "b1", "b2", "b3", "b4", "b5"],
        "C": ["c0", "c1", "c2", "c3"],
    }


def test_a_job_accepted_after_a_refused_one_in_the_same_batch_is_reported_as_a_gap(
    inner_broker: Broker,
) -> None:
    # given a broker that refuses A's first job but accepts A's second in the same batch
    broker = RefusingBroker(inner_broker, poison="poison")
    app = make_app(broker)
    worker = define(app)
    # when both are published in one call
    with pytest.raises(PublishError) as caught:
        worker.publish_many([("A", "poison"), ("A", "a1"), ("B", "b0")])
    # then the refused job is failed and the accepted one is reported as a gap
    assert [(i, e) for i, e, _ in caught.value.failed] == [(0, "A")]
    assert caught.value.gaps == [(1, "A")]


def test_a_refused_job_does_not_hold_back_other_shards(inner_broker: Broker) -> None:
    # given two entities in different shard queues, one of whose jobs is refused
    broker = RefusingBroker(inner_broker, poison="poison")
    app = make_app(broker)
    worker = define(app, shards=8)
    a, b = "order-1", "customer:42"
    assert shard_for(a, 8) != shard_for(b, 8)
    # when both publish
    with pytest.raises(PublishError) as caught:
        worker.publish_many([(a, "poison"), (b, "b0"), (b, "b1")])
    # then only the refused job failed and the other entity's jobs all arrived
    assert [(i, e) for i, e, _ in caught.value.failed] == [(0, a)]
    assert caught.value.sent == 2
    assert [j.payload for j in drain(app, queue_of(app, worker, b))] == ["b0", "b1"]
    assert drain(app, queue_of(app, worker, a)) == []


def test_a_failed_batch_fails_its_jobs_and_holds_back_their_entities(
    inner_broker: Broker,
) -> None:
    # given a broker whose first send_batch call fails whole
    broker = FailingFirstBatchBroker(inner_broker)
    app = make_app(broker)
    worker = define(app)
    # and 10 jobs of A and B in the first batch, then jobs of A, B and C
    items = [("A" if i % 2 else "B", i) for i in range(10)]
    items += [("A", 10), ("C", 11), ("B", 12), ("C", 13)]
    # when they are published
    with pytest.raises(PublishError) as caught:
        worker.publish_many(items)
    # then the whole first batch failed with the broker's error,
    # A's and B's later jobs were held back, and C's jobs were sent
    failed = caught.value.failed
    assert [i for i, _, _ in failed] == [*range(10), 10, 12]
    assert all("connection reset by peer" in reason for _, _, reason in failed[:10])
    assert caught.value.sent == 2
    jobs = drain(app, app.shard_queue(worker, 0))
    assert payloads_by_entity(jobs) == {"C": [11, 13]}


def test_publish_raises_publish_error_when_its_job_is_refused(inner_broker: Broker) -> None:
    app = make_app(RefusingBroker(inner_broker, poison="poison"))
    worker = define(app)
    with pytest.raises(PublishError) as caught:
        worker.publish("e1", "poison")
    assert caught.value.failed == [(0, "e1", RefusingBroker.REASON)]
    assert caught.value.sent == 0


class KeepOnlyReversed(shardq.Middleware):
    """Drops the jobs whose payload is "drop", reverses the rest and adds metadata; adds
    ``extra`` (jobs it makes itself) at the end."""

    def __init__(self, extra: Sequence[shardq.Job] = ()) -> None:
        self.extra = list(extra)

    def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
        kept = [j.with_meta(seen=True) for j in reversed(ctx.jobs) if j.payload != "drop"]
        ctx.jobs[:] = kept + self.extra
        return call()


def test_a_report_names_the_callers_items_when_a_middleware_drops_or_reorders_jobs(
    inner_broker: Broker,
) -> None:
    # given a publish middleware that drops some jobs and reverses the others
    app = make_app(RefusingBroker(inner_broker, poison="poison"))
    app.add_middleware(KeepOnlyReversed())
    worker = define(app)
    # when jobs are all accepted, then each item's message id is in its own slot
    report = worker.publish_many([("A", "a0"), ("B", "drop"), ("C", "c0")])
    assert report.message_ids[1] is None and report.sent == 2
    assert all(isinstance(report.message_ids[i], str) for i in (0, 2))
    by_entity = {j.entity: j.payload for j in drain_all(app, worker)}
    assert by_entity == {"A": "a0", "C": "c0"}
    # when the broker refuses item 3 and accepts A's item 0, sent after it in the same batch
    items = [("A", "a1"), ("B", "drop"), ("C", "c1"), ("A", "poison"), ("D", "d1")]
    with pytest.raises(PublishError) as caught:
        worker.publish_many(items)
    # then the error names item 3 as refused and item 0 as the gap, as the caller numbered them
    assert [(i, e) for i, e, _ in caught.value.failed] == [(3, "A")]
    assert caught.value.gaps == [(0, "A")] and caught.value.sent == 3
    assert "(first: item 3, entity 'A'" in str(caught.value)


def test_a_job_a_middleware_sees_shows_only_its_own_fields_to_dataclasses(
    inner_broker: Broker,
) -> None:
    # given a middleware that records what dataclasses tell of the jobs it sees
    app = make_app(inner_broker)
    shown: list[Any] = []

    class Record(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            for job in ctx.jobs:
                names = [f.name for f in dataclasses.fields(job)]
                shown.append((names, dataclasses.asdict(job), dataclasses.astuple(job)))
            return call()

    app.add_middleware(Record())
    # when a job is published with publish_many (which tags it with its item number)
    define(app).publish_many([shardq.Job("e", {"n": 1}, "d-1", {"t": 1})])
    # then fields, asdict and astuple show the job's own four fields, as for a user's Job
    assert shown == [
        (
            ["entity_id", "payload", "dedup_id", "meta"],
            {"entity_id": "e", "payload": {"n": 1}, "dedup_id": "d-1", "meta": {"t": 1}},
            ("e", {"n": 1}, "d-1", {"t": 1}),
        )
    ]


def test_a_job_a_middleware_made_itself_is_never_reported_as_a_callers_item(
    inner_broker: Broker,
) -> None:
    # given a middleware that adds a job it made (refused by the broker) and one copied
    # from an item of an earlier publish_many
    app = make_app(RefusingBroker(inner_broker, poison="poison"))
    worker = define(app)
    seen: list[shardq.Job] = []

    class Stash(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            seen.extend(ctx.jobs)
            return call()

    app.add_middleware(Stash())
    worker.publish_many([("E", "e0"), ("F", "f0")])
    app.add_middleware(KeepOnlyReversed([shardq.Job("Z", "poison"), seen[1].with_meta(x=1)]))
    # when two jobs are published, then both made jobs follow the caller's two items
    with pytest.raises(PublishError) as caught:
        worker.publish_many([("G", "g0"), ("H", "h0")])
    assert caught.value.failed == [(2, "Z", RefusingBroker.REASON)]
    assert "(first: a job added by a middleware, entity 'Z'" in str(caught.value)
    assert caught.value.sent == 3  # the caller's two items and the copy of f0
    assert sorted(j.payload for j in drain_all(app, worker)) == ["e0", "f0", "f0", "g0", "h0"]
    # and when a middleware makes every job anew, one for each item in the caller's order
    app.middleware[1:] = []

    class Anew(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            ctx.jobs[:] = [shardq.Job(j.entity_id, j.payload, j.dedup_id, {}) for j in ctx.jobs]
            return call()

    app.add_middleware(Anew())
    # then each is its item: publish returns the id of the job it sent
    assert isinstance(worker.publish("I", "i0"), str)
    report = worker.publish_many([("J", "j0"), ("K", "k0")])
    assert report.sent == 2 and None not in report.message_ids
    assert sorted(j.payload for j in drain_all(app, worker)) == ["i0", "j0", "k0"]
    # and when it makes two jobs in place of one, then publish says both were published
    two = [shardq.Job("audit", "x"), shardq.Job("audit", "y")]
    app.middleware[1:] = [KeepOnlyReversed(two)]
    with pytest.raises(PublishError, match=r"replaced it by 2 jobs it made itself, published"):
        worker.publish("L", "drop")
    # and when it only drops it, then publish says nothing was published
    app.middleware[1:] = [KeepOnlyReversed()]
    with pytest.raises(PublishError, match=r"dropped the job for entity 'M': nothing was"):
        worker.publish("M", "drop")


# -- unknown workers -----------------------------------------------------------------------------


def test_an_unregistered_worker_cannot_publish(app: shardq.App) -> None:
    # given a worker class no app registered
    class Stray(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # then publish and publish_many raise UnknownWorkerError
    with pytest.raises(UnknownWorkerError, match="Stray is not registered"):
        Stray.publish("e1", 1)
    with pytest.raises(UnknownWorkerError, match="Stray is not registered"):
        Stray.publish_many([("e1", 1)])


def test_the_publisher_refuses_a_worker_name_the_app_does_not_know(app: shardq.App) -> None:
    define(app)
    with pytest.raises(UnknownWorkerError, match="no worker named 'Nope'"):
        app.publisher.publish_many("Nope", [("e1", 1)])


def test_the_publisher_accepts_a_registered_worker_name(app: shardq.App) -> None:
    worker = define(app)
    report = app.publisher.publish_many("SyncOrder", [("e1", 1)])
    assert report.sent == 1
    assert [j.worker for j in drain(app, queue_of(app, worker, "e1"))] == ["SyncOrder"]


def test_jobs_whose_queue_was_retired_meanwhile_go_to_the_new_layout_naming_the_callers_items(
    inner_broker: Broker,
) -> None:
    # given a worker recorded with 2 shards whose layout copy is in hand, then resharded to
    # 3 shards behind this publisher's back, switched, and one old queue deleted
    broker = RefusingBroker(inner_broker, poison={"n": "bad"})
    app = make_app(broker)
    worker = define(app, shards=2)
    entities = [f"e{i}" for i in range(8)]
    for entity in entities:
        worker.publish(entity, {"n": "first"})
    drain_all(app, worker)

    def reshard(layout: WorkerLayout) -> WorkerLayout:
        return switch(announce(layout, "SyncOrder", 3, 60.0), layout.gen + 1)

    app.store.put("layout/SyncOrder", reshard(app.layouts.cached("SyncOrder")).to_value(),
                  version=1)  # fmt: skip
    retired = shard_for(entities[5], 2)
    assert [shard_for(e, 2) for e in entities[:5]].count(retired) < 5  # item 5 is not 5th there
    inner_broker.delete_queue(app.shard_queue(worker, retired, 0))
    # when a batch is published whose item 5 (of the deleted queue) the broker refuses
    items: list[tuple[str, dict[str, Any]]] = [(e, {"n": i}) for i, e in enumerate(entities)]
    items[5] = (entities[5], {"n": "bad"})
    with pytest.raises(PublishError) as caught:
        app.publisher.publish_many(worker, items)
    # then the error names the caller's item 5 of all 8, and counts the 7 published
    error = caught.value
    assert [(i, entity) for i, entity, _ in error.failed] == [(5, entities[5])]
    assert error.sent == 7
    assert "1 of 8 SyncOrder jobs were not published (first: item 5," in str(error)
    # and the 7 are in the old layout's queue left and the new layout's queues
    published = drain(app, app.shard_queue(worker, 1 - retired, 0))
    for shard in range(3):
        with contextlib.suppress(QueueNotFoundError):  # no entity of this shard
            published += drain(app, app.shard_queue(worker, shard, 1))
    assert sorted(e.payload["n"] for e in published) == [0, 1, 2, 3, 4, 6, 7]


def test_a_relay_of_large_jobs_keeps_each_batch_within_one_mib(inner_broker: Broker) -> None:
    # given ten jobs of 200 KB each, of ten entities (a batch holds one job of an entity),
    # received from a shard (as from a retired shard)
    from shardq.publish.relay import relay

    broker = WrappingBroker(inner_broker)
    app = make_app(broker)
    worker = define(app)
    worker.publish_many([(f"e{i}", "x" * 200_000) for i in range(10)])
    queue = app.shard_queue(worker, 0)
    messages = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=60)
    assert len(messages) == 10
    broker.batches.clear()
    # when they are relayed to the current layout, then every one is sent, in order,
    # in batches of at most 1 MiB
    relay(app, "SyncOrder", messages)
    assert [e.body for _, entries in broker.batches for e in entries] == [m.body for m in messages]
    assert all(
        sum(len(e.body) for e in entries) <= MAX_BATCH_BYTES for _, entries in broker.batches
    )
    assert max(len(entries) for _, entries in broker.batches) > 1  # not one job a batch


def test_a_relay_sends_no_job_after_a_refused_one_of_its_entity(inner_broker: Broker) -> None:
    # given three jobs of entity A and one of B received from a shard, A's second of which
    # the broker refuses when it is relayed
    from shardq.publish.relay import relay

    app = make_app(inner_broker)
    worker = define(app)
    worker.publish_many([("A", "a1"), ("A", "poison"), ("A", "a3"), ("B", "b1")])
    queue = app.shard_queue(worker, 0)
    messages = inner_broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=60)
    assert len(messages) == 4
    app.configure(broker=RefusingBroker(inner_broker, poison="poison"))
    # when they are relayed, then the relay fails
    with pytest.raises(BrokerError, match="relaying 1 jobs"):
        relay(app, "SyncOrder", messages)
    # and A's job after the refused one was not sent (a relay done again would find it
    # deduplicated and put the refused job after it, out of order)
    sent = [envelope.decode(e.body).payload for _, entries in app.broker.batches for e in entries]
    assert sent[:2] == ["a1", "poison"] and "a3" not in sent
