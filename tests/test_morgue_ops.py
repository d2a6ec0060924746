"""Listing, requeueing and purging dead jobs, by worker and by entity."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shardq
from shardq import envelope
from shardq.config import Config
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
