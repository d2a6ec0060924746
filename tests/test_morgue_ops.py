"""Listing, requeueing and purging dead jobs, by worker and by entity."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardq
from shardq import envelope, morgue
from shardq.broker import Message, SendEntry
from shardq.broker.base import batches
from shardq.config import Config
from shardq.ensure import ensure_state_table
from shardq.morgue import MorgueQueue
from shardq.node import Node
from shardq.sharding import shard_for
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker


@pytest.fixture(params=["sqlite", "memory", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[shardq.App]:
    """The ledger app with 3 dead jobs of e1 and 2 of e2 in its morgue."""
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    broker = make_broker(request.param, tmp_path, request)
    ledger.app.configure(
        Config(queue_prefix=f"m{tmp_path.name[-8:].replace('_', '')}-", idle_wait_seconds=1),
        broker=broker,
    )
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    Ledgered.publish_many(
        [("e1", {"n": n, "permanent": True}) for n in range(3)]
        + [("e2", {"n": n, "permanent": True}) for n in range(2)]
    )
    Node(ledger.app, ledger.app.plan(threads=1), until_empty=True).run()
    yield ledger.app
    broker.close()


def numbers(records: list[shardq.morgue.MorgueRecord]) -> list[tuple[str, int]]:
    return [(r.entity_id, envelope.decode(r.body).payload["n"]) for r in records]


def queued(app: shardq.App, entity: str) -> list[int]:
    queue = app.shard_queue("Ledgered", shard_for(entity, 3))
    got = app.broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    return [envelope.decode(m.body).payload["n"] for m in got if m.group_id == entity]


def test_list_shows_each_entitys_dead_jobs_in_order_and_keeps_them(app: shardq.App) -> None:
    morgue = MorgueQueue(app, "Ledgered")
    records = morgue.list_jobs()
    assert sorted(numbers(records)) == [("e1", 0), ("e1", 1), ("e1", 2), ("e2", 0), ("e2", 1)]
    assert [n for e, n in numbers(records) if e == "e1"] == [0, 1, 2]
    assert all(r.reason == "permanent_error" for r in records)
    # listing again shows the same: nothing was removed or hidden
    assert sorted(numbers(morgue.list_jobs())) == sorted(numbers(records))
    assert numbers(morgue.list_jobs(entity="e2")) == [("e2", 0), ("e2", 1)]
    assert len(morgue.list_jobs(limit=2)) == 2
    assert morgue.size() == 5


def test_requeue_by_entity_puts_its_jobs_back_in_order_and_leaves_the_rest(
    app: shardq.App,
) -> None:
    morgue = MorgueQueue(app, "Ledgered")
    seen: list[int] = []
    assert morgue.requeue(entity="e1", progress=seen.append) == 3
    assert seen and seen[-1] == 3
    assert queued(app, "e1") == [0, 1, 2]
    assert numbers(morgue.list_jobs()) == [("e2", 0), ("e2", 1)]


def test_purge_by_message_id_removes_only_that_job(app: shardq.App) -> None:
    morgue = MorgueQueue(app, "Ledgered")
    target = next(r for r in morgue.list_jobs() if r.entity_id == "e2")
    assert morgue.purge(message_ids=[target.message_id]) == 1
    assert sorted(numbers(morgue.list_jobs())) == [("e1", 0), ("e1", 1), ("e1", 2), ("e2", 1)]
    assert queued(app, "e2") == []


def test_purge_everything_empties_the_morgue(app: shardq.App) -> None:
    morgue = MorgueQueue(app, "Ledgered")
    assert morgue.purge() == 5
    assert morgue.list_jobs() == [] and morgue.size() == 0


def bury(app: shardq.App, jobs: list[tuple[str, int]]) -> None:
    """Write morgue records straight into the morgue, in this order."""
    queue = app.morgue_queue("Ledgered")
    entries = []
    for i, (entity, n) in enumerate(jobs):
        body = envelope.encode(envelope.Envelope("Ledgered", entity, {"n": n}))
        message = Message("shard.fifo", f"id-{entity}-{n}", "", body, entity, 1, 0.0, str(i))
        record = morgue.record_for(message, morgue.REASON_MAX_RETRIES, RuntimeError("no"), 4)
        entries.append(morgue.entry(record, 1024 * 1024))
    for chunk in batches(entries):
        sent = app.broker.send_batch(
            queue, [SendEntry(str(i), e.body, e.group_id, e.dedup_id) for i, e in enumerate(chunk)]
        )
        assert not sent.failed


def test_list_shows_every_dead_job_even_when_an_entity_straddles_receives(
    app: shardq.App,
) -> None:
    # given 162 more dead jobs: entity "a" has 5, spread far apart among 40 other entities
    spread = [(f"o{i % 40}", 100 + i) for i in range(157)]
    for n, at in enumerate([3, 50, 100, 140, 156]):
        spread.insert(at, ("a", n))
    bury(app, spread)
    morgue_queue = MorgueQueue(app, "Ledgered")
    # when the whole morgue is listed
    listing = morgue_queue.browse(limit=1000)
    # then every dead job shows, each entity's in order, and nothing is missing
    assert len(listing.records) == 167 and listing.size == 167
    assert (listing.unreached, listing.limited) == (0, False)
    assert [n for e, n in numbers(listing.records) if e == "a"] == [0, 1, 2, 3, 4]
    assert numbers(morgue_queue.browse(entity="a").records) == [("a", n) for n in range(5)]
    # and the listing held nothing back: the entity's dead jobs requeue at once
    assert morgue_queue.requeue(entity="a") == 5


def test_list_says_how_many_it_did_not_show(app: shardq.App) -> None:
    # given an entity with 12 dead jobs (one receive returns at most 10 of them)
    bury(app, [("big", n) for n in range(12)])
    morgue_queue = MorgueQueue(app, "Ledgered")
    # when the morgue is listed, in full and with a limit
    full = morgue_queue.browse()
    limited = morgue_queue.browse(limit=4)
    # then the listing shows the first 10 of that entity and counts the 2 it could not reach
    assert [n for e, n in numbers(full.records) if e == "big"] == list(range(10))
    assert (len(full.records), full.size, full.unreached, full.limited) == (15, 17, 2, False)
    assert (len(limited.records), limited.limited) == (4, True)
    assert limited.size - len(limited.records) == 13


FORGED = {
    "body is a number": {"body": 7},
    "attempts is a string": {"attempts": "3"},
    "failed_at is a string": {"failed_at": "yesterday"},
    "reason is a list": {"reason": ["x"]},
}


def forged(entity: str, **wrong: object) -> str:
    doc = {
        "kind": "shardq.morgue",
        "v": 1,
        "body": "{}",
        "entity_id": entity,
        "reason": "max_retries",
        "error_type": "E",
        "error_message": "m",
        "traceback": "",
        "attempts": 1,
        "failed_at": 1.0,
        "source_queue": "q",
        "message_id": f"forged-{entity}",
    }
    return json.dumps({**doc, **wrong})


def test_forged_records_list_as_unreadable_and_requeue_refuses_them_keeping_them(
    app: shardq.App,
) -> None:
    # given morgue messages with the right kind but wrong field types, written straight
    # into the morgue queue
    queue = app.morgue_queue("Ledgered")
    entries = [
        SendEntry(str(i), forged(f"f{i}", **wrong), f"f{i}", f"forged-{i}")
        for i, wrong in enumerate(FORGED.values())
    ]
    assert not app.broker.send_batch(queue, entries).failed
    morgue_queue = MorgueQueue(app, "Ledgered")
    # when the morgue is listed
    records = morgue_queue.list_jobs()
    # then each forged one shows as unreadable, saying what is wrong, next to the real ones
    unreadable = {r.entity_id: r for r in records if r.reason == "unreadable_record"}
    assert sorted(unreadable) == ["f0", "f1", "f2", "f3"]
    for i, problem in enumerate(["body", "attempts", "failed_at", "reason"]):
        assert problem in unreadable[f"f{i}"].error_message
    assert len(records) == 9
    # and a requeue of everything refuses them, names them, and leaves them in the morgue
    refused: list[tuple[str, str]] = []
    requeued = morgue_queue.requeue(refused=lambda r, why: refused.append((r.entity_id, why)))
    assert requeued == 5
    assert sorted(e for e, _ in refused) == ["f0", "f1", "f2", "f3"]
    assert all("not a readable shardq morgue record" in why for _, why in refused)
    assert sorted(r.entity_id for r in morgue_queue.list_jobs()) == ["f0", "f1", "f2", "f3"]
    # and a purge by id removes one of them
    assert morgue_queue.purge(message_ids=[unreadable["f0"].message_id]) == 1
    assert morgue_queue.size() == 3
