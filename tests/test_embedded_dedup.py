"""The embedded broker's deduplication ids: kept their 5 minutes across minute buckets,
dropped whole once expired, a few bytes each, carried over from files of earlier
versions.

The broker's deduplication clock (``broker._dedup.clock``) is set by the tests, so
minutes pass at once.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from shardq.broker import SendEntry, SqliteBroker

QUEUE = "q.fifo"


class Clock:
    """A settable clock, starting just before a minute ends."""

    def __init__(self) -> None:
        self.start = (time.time() // 60) * 60 + 59.5
        self.now = self.start

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        """Move to ``seconds`` after the start."""
        self.now = self.start + seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def broker(tmp_path: Path, clock: Clock) -> SqliteBroker:
    instance = SqliteBroker(str(tmp_path / "broker.db"))
    instance._dedup.clock = clock
    instance.ensure_queue(QUEUE)
    yield instance  # type: ignore[misc]
    instance.close()


def send(broker: SqliteBroker, body: str, dedup_id: str) -> str:
    result = broker.send_batch(QUEUE, [SendEntry("0", body, "g", dedup_id)])
    assert not result.failed
    return result.message_ids["0"]


def drain(broker: SqliteBroker) -> list[str]:
    seen: list[str] = []
    while batch := broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=30):
        seen += [m.body for m in batch]
        broker.delete_batch(QUEUE, [m.receipt for m in batch])
    return seen


def bucket_tables(broker: SqliteBroker) -> list[str]:
    with broker._file.read("inspecting it") as db:
        return [
            row[0]
            for row in db.execute(
                "SELECT name FROM sqlite_master WHERE name LIKE 'shardq_dedup_%' ORDER BY name"
            )
        ]


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def test_an_id_is_remembered_for_its_5_minutes_across_minute_buckets(
    broker: SqliteBroker, clock: Clock
) -> None:
    # given an id sent half a second before a minute ends, and its message deleted
    first = send(broker, "a-first", "a")
    assert drain(broker) == ["a-first"]
    # when it is sent again in the next minute, and 4 more minutes on
    clock.at(1)
    again = send(broker, "a-again", "a")
    b = send(broker, "b", "b")
    clock.at(299)
    late = send(broker, "a-late", "a")
    # then each copy was dropped with the first message's id
    assert again == late == first
    # and once 5 minutes (and up to 1 s) have passed it is new again, with an id of its
    # own, while an id sent a second later, in the next minute, is still remembered
    clock.at(301)
    renewed = send(broker, "a-renewed", "a")
    assert send(broker, "b-again", "b") == b
    assert renewed not in (first, b)
    assert drain(broker) == ["b", "a-renewed"]
    # (the first minute's table went with that send: the next minute's and this one's stay)
    assert len(bucket_tables(broker)) == 2


def test_expired_buckets_are_dropped_whole_by_maintain_and_by_sends(
    broker: SqliteBroker, clock: Clock
) -> None:
    # given ids sent in two minutes, a minute apart
    send(broker, "1", "first-minute")
    clock.at(60)
    send(broker, "2", "second-minute")
    first, second = bucket_tables(broker)
    # when the first minute's ids have all left their window and the node maintains
    clock.at(301)
    broker.maintain()
    # then that minute's table is gone and the other one kept
    assert bucket_tables(broker) == [second]
    # and when the second minute's ids expire too, the next send drops its table
    clock.at(361)
    send(broker, "3", "later")
    (current,) = bucket_tables(broker)
    assert current not in (first, second)
    assert drain(broker) == ["1", "2", "3"]


def test_processes_on_one_file_see_each_others_minutes(broker: SqliteBroker, clock: Clock) -> None:
    # given a second broker on the same file (as another process), which has sent already
    other = SqliteBroker(broker.path)
    other._dedup.clock = clock
    send(other, "early", "early")
    # when the first makes the next minute's table with an id, and drops the first
    # minute's once it expired
    clock.at(1)
    first = send(broker, "x", "x")
    clock.at(301)
    broker.maintain()
    # then the other sees the new table and not the dropped one: the copy is dropped
    assert send(other, "x-again", "x") == first
    assert drain(other) == ["early", "x"]
    other.close()


def test_a_drained_burst_keeps_its_ids_in_a_few_bytes_each(
    broker: SqliteBroker, clock: Clock
) -> None:
    # given a fresh file, then 5,000 messages with 32-character ids sent and drained
    broker.maintain()
    fresh = file_bytes(broker.path)
    ids = [uuid.uuid4().hex for _ in range(5000)]
    for start in range(0, len(ids), 10):
        entries = [SendEntry(str(i), "x" * 400, f"e{i}", d) for i, d in enumerate(ids[start:][:10])]
        broker.send_batch(QUEUE, entries)
    assert len(drain(broker)) == 5000
    # when the node maintains while the ids are still in their window
    clock.at(60)
    broker.maintain()
    # then file and WAL hold little more than 40 bytes per id
    assert file_bytes(broker.path) <= fresh + 40 * len(ids)
    # and the ids are still remembered
    assert broker.send_batch(QUEUE, [SendEntry("0", "copy", "e0", ids[0])]).message_ids
    assert drain(broker) == []


_EARLIER_DEDUP = """
CREATE TABLE dedup (
    queue TEXT NOT NULL,
    dedup_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (queue, dedup_id)
) WITHOUT ROWID;
CREATE INDEX dedup_by_expiry ON dedup (expires_at);
"""


def test_a_file_of_an_earlier_version_keeps_the_ids_in_their_window(tmp_path: Path) -> None:
    # given a file as earlier versions made it: one dedup table, queues without a salt
    path = str(tmp_path / "earlier.db")
    SqliteBroker(path).close()
    now = time.time()
    with sqlite3.connect(path) as db:
        db.executescript(_EARLIER_DEDUP)
        db.execute("ALTER TABLE queues DROP COLUMN salt")
        db.execute(
            "INSERT INTO queues (name, visibility_timeout, max_message_bytes) VALUES (?, 30, 1024)",
            (QUEUE,),
        )
        db.executemany(
            "INSERT INTO dedup VALUES (?, ?, ?, ?)",
            [(QUEUE, "recent", "id-of-recent", now + 200), (QUEUE, "expired", "gone", now - 1)],
        )
    # when this version opens it
    broker = SqliteBroker(path)
    # then an id still in its window is remembered with its first message's id
    recent = broker.send_batch(QUEUE, [SendEntry("0", "recent-again", "g", "recent")])
    assert recent.message_ids == {"0": "id-of-recent"}
    # and an expired one is new, with an id of its own
    expired = broker.send_batch(QUEUE, [SendEntry("0", "expired-again", "g", "expired")])
    assert expired.message_ids["0"] != "gone"
    assert drain(broker) == ["expired-again"]
    # and the old table is gone
    with broker._file.read("inspecting it") as db:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "dedup" not in names and "dedup_by_expiry" not in names
    broker.close()


def test_a_queue_an_earlier_version_created_alongside_gets_its_salt_on_first_send(
    broker: SqliteBroker,
) -> None:
    # given a queue without a salt (as an earlier version running on the file makes one)
    with broker._file.read("inspecting it") as db:
        db.execute("UPDATE queues SET salt = NULL")
    fresh = SqliteBroker(broker.path)
    # when an id is sent to it twice
    first = fresh.send_batch(QUEUE, [SendEntry("0", "x", "g", "once")])
    again = fresh.send_batch(QUEUE, [SendEntry("0", "x", "g", "once")])
    # then the copy gets the first message's id, and the queue has a salt now
    assert again.message_ids == first.message_ids
    with broker._file.read("inspecting it") as db:
        assert db.execute("SELECT salt FROM queues").fetchone()[0] is not None
    fresh.close()
