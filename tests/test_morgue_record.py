"""The morgue record: the store items of a dead job, a big job split and joined, and the
old queue morgue's two formats read when they are moved into the store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq import morgue
from shardq.core import envelope
from shardq.core.config import Config
from shardq.morgue import record as morgue_record
from shardq.morgue.migrate import read_queue_record
from shardq.morgue.record import summary
from shardq.ops.ensure import ensure_state_table
from shardq.store import Item, MemoryStore
from shardq.store.base import MAX_VALUE_BYTES, DamagedItem, StoreError
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
    node = app.node(app.plan(threads=1), until_empty=True)
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
    (record,) = morgue.Morgue(app, "Ledgered").list_jobs()
    assert record.reason == "permanent_error" and record.pieces > 1
    assert envelope.decode(record.body).payload == escape_heavy_payload(0, 925_000)
    # and a requeue sends it back whole
    assert morgue.Morgue(app, "Ledgered").requeue(morgue.Filter(entity="big")) == 1


def message(body: str, group: str = "e") -> shardq.broker.Message:
    return shardq.broker.Message(
        queue="q.fifo",
        body=body,
        receipt="r",
        message_id="m-1",
        group_id=group,
        receive_count=3,
        sent_at=1.0,
        sequence="1",
    )


def failure() -> shardq.PermanentError:
    try:
        raise shardq.PermanentError("broken " * 2000)
    except shardq.PermanentError as exc:
        return exc


def stored(record: morgue.MorgueRecord) -> tuple[MemoryStore, morgue.MorgueRecord]:
    """The record written to a store and read back whole."""
    store = MemoryStore()
    morgue.bury(store, "W", [record])
    summaries = store.query_all("morgue/W/t/")
    assert len(summaries) == 1
    whole = store.get(summary(summaries[0]).key)
    assert whole is not None
    k = whole.key.rpartition("/")[2]
    pieces = [i.value["body"] for i in store.query_all(f"morgue/W/p/{k}/")]
    return store, morgue_record.whole(whole, pieces)


def test_a_job_buried_again_is_recorded_once_and_another_job_of_its_entity_is_not_lost() -> None:
    # given a dead job of entity e in the morgue
    store = MemoryStore()
    first = morgue.record_for(message("x"), morgue.REASON_MAX_RETRIES, failure(), 3)
    morgue.bury(store, "W", [first])
    # when the same message dies again (its delete came after its visibility ran out),
    # and the morgue move of the old queue runs twice over another job of e
    again = morgue.record_for(message("x"), morgue.REASON_MAX_RETRIES, failure(), 4)
    morgue.bury(store, "W", [again])
    other = dataclasses.replace(first, message_id="m-2")
    morgue.bury(store, "W", [other], at_death=True)
    morgue.bury(store, "W", [other], at_death=True)
    # then each job has one record, listed once
    listed = [summary(i).message_id for i in store.query_all("morgue/W/t/")]
    assert sorted(listed) == ["m-1", "m-2"]
    assert len(store.query_all("morgue/W/e/")) == 2


class DiesAfter(MemoryStore):
    """A store whose writer is killed after ``writes`` puts: each put after raises."""

    def __init__(self, writes: int) -> None:
        super().__init__()
        self.left = writes

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        if self.left == 0:
            raise StoreError("the node was killed")
        self.left -= 1
        return super().put(key, value, version=version)


@pytest.mark.parametrize("writes", range(6))
def test_a_burial_cut_short_after_any_write_is_finished_by_the_next_and_recorded_once(
    writes: int,
) -> None:
    # given a dead job whose body takes 4 items, its burial (6 writes: id item, 3 more
    # pieces, record, summary) cut short after ``writes`` of them by its node's death
    body = "x" * 700_000
    store = DiesAfter(writes)
    first = morgue.record_for(message(body), morgue.REASON_PERMANENT, failure(), 1)
    assert len(morgue_record.items("W", first, "1")) == 6
    with pytest.raises(StoreError):
        morgue.bury(store, "W", [first])
    # when its message is delivered again, fails again and is buried, then once more
    store.left = -1
    again = morgue.record_for(message(body), morgue.REASON_PERMANENT, failure(), 2)
    morgue.bury(store, "W", [again])
    morgue.bury(store, "W", [again])
    # then the job is recorded once, whole, as it died the second time
    (top,) = store.query_all("morgue/W/t/")
    found = store.get(summary(top).key)
    assert found is not None
    pieces = [i.value["body"] for i in store.query_all("morgue/W/p/")]
    back = morgue_record.whole(found, pieces)
    assert (back.message_id, back.attempts, back.body) == ("m-1", 2, body)
    # and nothing else is stored: no piece or record of the first burial is left over
    assert len(store.query_all("morgue/")) == 6


class DamagedId(MemoryStore):
    """A store whose job ``m-1``'s id item cannot be read (a hand edit, a damaged file)."""

    def get(self, key: str) -> Item | None:
        if key == morgue_record.id_key("W", "m-1"):
            raise DamagedItem(f"store item {key!r} is damaged")
        return super().get(key)


def test_a_burial_cut_short_whose_id_item_is_then_damaged_is_finished_not_recorded_twice() -> None:
    # given a dead job whose burial wrote its id item, body and record, not its summary,
    # then its id item damaged
    store = DamagedId()
    first = morgue.record_for(message("x"), morgue.REASON_PERMANENT, failure(), 1)
    *writes, _ = morgue_record.items("W", first, morgue_record.new_stamp())
    for key, value in [writes[-1], *writes[:-1]]:  # the id item first, as a burial does
        store.put(key, value, version=None)
    # when the job is delivered again, dies again and is buried
    again = morgue.record_for(message("x"), morgue.REASON_PERMANENT, failure(), 2)
    morgue.bury(store, "W", [again])
    # then it has one record, summed up, as it died the second time
    (record,) = store.query_all("morgue/W/e/")
    (top,) = store.query_all("morgue/W/t/")
    assert summary(top).key == record.key and summary(record).attempts == 2


class OtherNodeFirst(MemoryStore):
    """A store where another node's burial of the same job writes the summary just
    before this one does (the job's visibility ran out while its node buried it)."""

    def put(self, key: str, value: Mapping[str, Any], *, version: int | None) -> Item:
        if "/t/" in key and not self.query_all(key):
            super().put(key, {**value, "attempts": 1}, version=None)
        return super().put(key, value, version=version)


def test_a_job_two_nodes_bury_at_once_is_recorded_once_and_neither_fails() -> None:
    # given a dead job whose burial was cut short after its record item
    store = OtherNodeFirst()
    first = morgue.record_for(message("x"), morgue.REASON_PERMANENT, failure(), 1)
    *writes, _ = morgue_record.items("W", first, morgue_record.new_stamp())
    for key, value in [writes[-1], *writes[:-1]]:
        MemoryStore.put(store, key, value, version=None)
    # when it is buried again while another node finishes the same burial
    again = morgue.record_for(message("x"), morgue.REASON_PERMANENT, failure(), 2)
    morgue.bury(store, "W", [again])
    # then it is recorded once: the summary the other node wrote stands
    (top,) = store.query_all("morgue/W/t/")
    assert summary(top).attempts == 1 and len(store.query_all("morgue/W/e/")) == 1


def test_a_record_dies_at_the_time_given_and_reads_back_with_it() -> None:
    # given a job that died at a Unix time the test chose
    record = morgue.record_for(message("x"), morgue.REASON_PERMANENT, failure(), 1, now=1234.5)
    # when it is written and read back
    _, back = stored(record)
    # then it died then
    assert record.failed_at == back.failed_at == 1234.5


@pytest.mark.parametrize("body_size", [100, 300_000, 500_000, 1_048_576])
def test_a_body_of_any_size_is_split_over_items_that_fit_and_read_back_verbatim(
    body_size: int,
) -> None:
    # given a dead job's body full of characters JSON escapes (up to 6 bytes each)
    body = ('"\\\n\u0001' * body_size)[:body_size]
    record = morgue.record_for(message(body), morgue.REASON_PERMANENT, failure(), 3, {"t": 1})
    # when it is stored
    store, back = stored(record)
    # then no item is over the store's limit, and it reads back whole
    for item in store.query_all("morgue/"):
        assert len(json.dumps(item.value, sort_keys=True).encode()) <= MAX_VALUE_BYTES
    assert back.body == body and back.reason == "permanent_error"
    assert (back.entity_id, back.message_id, back.attempts, back.meta) == ("e", "m-1", 3, {"t": 1})
    assert back.body_sha256 == hashlib.sha256(body.encode()).hexdigest()
    assert back.first_sent_at == 1.0 and back.failed_at > 1.0
    assert len(store.query_all("morgue/")) == 3 + back.pieces - 1  # summary, record, id
    assert (back.pieces > 1) == (body_size > 100_000)


def test_a_record_whose_body_was_altered_or_lost_a_piece_reads_as_unreadable() -> None:
    store, back = stored(morgue.record_for(message("x" * 700_000), "max_retries", failure(), 1))
    item = store.get(back.key)
    assert item is not None
    assert "SHA-256" in morgue_record.whole(item, []).error_message
    altered = morgue_record.whole(item, ["y" * (700_000 - len(item.value["body"]))])
    assert altered.reason == "unreadable_record"
    assert morgue.requeue_problem(altered) is not None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"entity_id": 7}, "entity_id is not a string"),
        ({"attempts": "3"}, "attempts is not a whole number"),
        ({"failed_at": "yesterday"}, "failed_at is not a time"),
        ({"body": None}, "body is not a string"),
    ],
)
def test_a_malformed_item_is_listed_as_unreadable_saying_why(
    value: dict[str, object], problem: str
) -> None:
    store, back = stored(morgue.record_for(message("{}", "a/b"), "max_retries", failure(), 1))
    item = store.get(back.key)
    assert item is not None
    bad = Item(item.key, {**item.value, **value}, item.version)
    record = morgue_record.whole(bad, [])
    assert record.reason == "unreadable_record" and problem in record.error_message
    assert record.entity_id == "a/b" or "entity_id" in problem


def queue_message(body: str, group: str = "e") -> shardq.broker.Message:
    return shardq.broker.Message("w-morgue.fifo", "q-1", "r", body, group, 1, 5.0, "1")


OLD_V1 = {
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


def test_both_formats_of_the_old_queue_morgue_read() -> None:
    # given a version 1 record (the body a field) and a version 2 one (header line, body)
    v1 = json.dumps(OLD_V1)
    header = {k: v for k, v in OLD_V1.items() if k != "body"}
    v2 = json.dumps({**header, "v": 2, "body_kept": True}) + "\n" + OLD_V1["body"]
    dropped = json.dumps({**header, "v": 2, "body_kept": False}) + "\n"
    # when they are read, then every field is there and the payload decodes
    for text in (v1, v2):
        record = read_queue_record(queue_message(text))
        assert (record.reason, record.attempts, record.failed_at) == ("max_retries", 4, 1.7e9 + 0.5)
        assert morgue.payload_of(record) == {"n": 1}
        assert morgue.requeue_problem(record) is None
    # and a record kept without its body reads, but cannot be requeued
    bodiless = read_queue_record(queue_message(dropped))
    assert bodiless.reason == "max_retries" and bodiless.body == ""
    assert "too large" in (morgue.requeue_problem(bodiless) or "")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"kind": "shardq.morgue", "v": 2}', "version 2"),
        ('{"kind": "shardq.morgue", "v": 9}\nbody', "version 9"),
        ('{"kind": "other"}', "not a shardq morgue record"),
        ("[" * 5000, "nested too deeply"),
        (json.dumps({**OLD_V1, "entity_id": "x"}), "sits in group"),
    ],
)
def test_an_old_queue_message_that_is_not_a_record_is_kept_as_unreadable_saying_why(
    text: str, problem: str
) -> None:
    record = read_queue_record(queue_message(text))
    assert record.reason == "unreadable_record" and problem in record.error_message
    assert record.body == text and record.entity_id == "e"
