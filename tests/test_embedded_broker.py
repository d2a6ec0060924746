"""The embedded broker's own behaviour: a full disk, foreign files, URL options,
disk housekeeping and the test-only group reopening mode.

A full disk is simulated without root by SQLite's ``PRAGMA max_page_count`` on the
broker's connection: once the file may not grow, every write needing a new page
fails with SQLITE_FULL exactly as on a full disk.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.broker import Broker, MemoryBroker, SendEntry, SqliteBroker, broker_from_url
from shardq.broker.sqlite import compact
from shardq.broker.sqlite_store import FILE_FORMAT
from shardq.core.errors import BrokerError, ConfigError, PublishError

QUEUE = "q.fifo"


def entries(prefix: str, count: int = 10, size: int = 50) -> list[SendEntry]:
    return [
        SendEntry(str(i), f"{prefix}-{i}:" + "x" * size, f"{prefix}-{i}", uuid.uuid4().hex)
        for i in range(count)
    ]


def limit_file(broker: SqliteBroker, pages: int | None) -> None:
    """Let the file grow by ``pages`` more pages at most (None: no limit)."""
    with broker._file.read("inspecting it") as db:
        current = db.execute("PRAGMA page_count").fetchone()[0]
        limit = 2**30 if pages is None else current + pages
        db.execute(f"PRAGMA max_page_count = {limit}")


def drain(broker: Broker, queue: str = QUEUE) -> list[str]:
    seen: list[str] = []
    while batch := broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30):
        seen += [m.body for m in batch]
        assert not broker.delete_batch(queue, [m.receipt for m in batch]).failed
    return seen


def expire_dedup_ids(broker: SqliteBroker) -> None:
    """Move the broker's deduplication clock past the window of every id sent so far."""
    broker._dedup.clock = lambda: time.time() + 7 * 60


def dedup_tables(broker: SqliteBroker) -> int:
    with broker._file.read("inspecting it") as db:
        return int(
            db.execute(
                "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'shardq_dedup_%'"
            ).fetchone()[0]
        )


def file_bytes(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


@pytest.fixture
def broker(tmp_path: Path) -> SqliteBroker:
    instance = SqliteBroker(str(tmp_path / "broker.db"))
    instance.ensure_queue(QUEUE)
    yield instance  # type: ignore[misc]
    instance.close()


# -- a full disk ----------------------------------------------------------------


def test_a_full_file_fails_sends_and_receives_with_a_broker_error_naming_it(
    broker: SqliteBroker,
) -> None:
    # given 300 messages, then a file that may not grow any more
    for n in range(30):
        broker.send_batch(QUEUE, entries(f"a{n}"))
    limit_file(broker, 0)
    # when a send and a receive need room
    with pytest.raises(BrokerError) as sent:
        for n in range(100):
            broker.send_batch(QUEUE, entries(f"b{n}"))
    with pytest.raises(BrokerError) as received:
        for _ in range(30):
            broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=30)
    # then each says the file is full and names it
    for problem in (sent.value, received.value):
        assert "is full" in str(problem)
        assert broker.path in str(problem)
        assert isinstance(problem.__cause__, sqlite3.OperationalError)


def test_after_room_returns_everything_works_and_nothing_was_lost(
    broker: SqliteBroker,
) -> None:
    # given messages stored before the file filled up, and sends refused once it had
    stored = [e.body for n in range(30) for e in entries(f"a{n}")]
    for n in range(30):
        broker.send_batch(QUEUE, entries(f"a{n}"))
    limit_file(broker, 0)
    refused = 0
    for n in range(20):
        try:
            result = broker.send_batch(QUEUE, entries(f"b{n}"))
            stored += [e.body for e in entries(f"b{n}") if e.id in result.message_ids]
        except BrokerError:
            refused += 1
    assert refused
    # when room returns
    limit_file(broker, None)
    broker.send_batch(QUEUE, entries("after"))
    # then every stored message and the new ones are received, once each
    assert sorted(drain(broker)) == sorted(stored + [e.body for e in entries("after")])


def test_a_delete_on_a_full_file_still_works_and_frees_room(broker: SqliteBroker) -> None:
    for n in range(30):
        broker.send_batch(QUEUE, entries(f"a{n}"))
    received = broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=30)
    limit_file(broker, 0)
    # when the received messages are deleted on the full file
    result = broker.delete_batch(QUEUE, [m.receipt for m in received])
    # then they are gone: a node can still drain a full file
    assert not result.failed
    assert broker.counts(QUEUE).in_flight == 0


def test_publish_many_on_a_full_file_reports_exactly_the_jobs_not_stored(
    tmp_path: Path,
) -> None:
    # given an app on the embedded broker whose file may grow only a little
    app = shardq.App(shardq.Config(), broker=SqliteBroker(str(tmp_path / "b.db")))

    class Sync(shardq.Worker):
        shards = 1

        def perform(self, entity_id: str, payloads: list[object]) -> None:
            pass

    app.register(Sync)
    app.ensure_queues()
    broker = app.broker
    assert isinstance(broker, SqliteBroker)
    limit_file(broker, 12)
    # when 500 jobs over 50 entities are published
    jobs = [(f"e{i % 50}", {"n": i, "pad": "x" * 200}) for i in range(500)]
    with pytest.raises(PublishError) as caught:
        Sync.publish_many(jobs)
    error = caught.value
    failed = {index for index, _, _ in error.failed}
    # then some were stored and some not, and the report names the unstored ones
    assert 0 < len(failed) < 500
    assert error.sent == 500 - len(failed)
    assert any("is full" in reason for _, _, reason in error.failed)
    # and, once room returns, exactly the jobs not reported failed are in the queue
    limit_file(broker, None)
    queue = app.shard_queue("Sync", 0)
    stored = {shardq.core.envelope.decode(body, None).payload["n"] for body in drain(broker, queue)}
    assert stored == set(range(500)) - failed
    app.broker.close()


# -- files that are not shardq's ------------------------------------------------


def test_a_file_with_other_tables_is_refused_unless_allowed(tmp_path: Path) -> None:
    # given an application's database
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    # when the embedded broker is pointed at it
    with pytest.raises(BrokerError) as refused:
        SqliteBroker(str(path))
    # then it is refused, naming the tables and the option, and the file is unchanged
    assert "customers" in str(refused.value)
    assert "allow_other_tables=1" in str(refused.value)
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"customers"}
    # and with the option it shares the file
    shared = broker_from_url(f"sqlite:///{path}?allow_other_tables=1")
    shared.ensure_queue(QUEUE)
    shared.close()


def test_a_table_of_another_application_with_a_shardq_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, text TEXT)")
    with pytest.raises(BrokerError, match="'messages' is another application's"):
        SqliteBroker(str(path), allow_other_tables=True)


def test_a_file_that_is_not_sqlite_says_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    with pytest.raises(BrokerError) as refused:
        SqliteBroker(str(path))
    assert "not an SQLite database" in str(refused.value)
    assert "directory exists" not in str(refused.value)
    assert path.read_bytes().startswith(b"these are my notes")


# -- the file's format version ---------------------------------------------------


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def set_user_version(path: Path, version: int) -> None:
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


def test_a_new_file_is_marked_with_its_format_version(tmp_path: Path) -> None:
    # when the embedded broker creates a file, then the file says its format
    path = tmp_path / "b.db"
    SqliteBroker(str(path)).close()
    assert user_version(path) == FILE_FORMAT >= 1


def test_an_unmarked_file_of_an_earlier_version_is_marked_and_keeps_its_jobs(
    tmp_path: Path,
) -> None:
    # given a file as earlier versions left it: shardq's tables, jobs, no format version
    path = tmp_path / "b.db"
    old = SqliteBroker(str(path))
    old.ensure_queue(QUEUE)
    old.send_batch(QUEUE, entries("old", 3))
    old.close()
    set_user_version(path, 0)
    # when this version opens it, then it is marked and every job is still there
    broker = SqliteBroker(str(path))
    assert user_version(path) == FILE_FORMAT
    assert sorted(b.split(":")[0] for b in drain(broker)) == ["old-0", "old-1", "old-2"]
    broker.close()


def test_a_file_of_an_unknown_format_is_refused_naming_it_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    # given a file a later shardq wrote (another format version), with a job in it
    path = tmp_path / "b.db"
    later = SqliteBroker(str(path))
    later.ensure_queue(QUEUE)
    later.send_batch(QUEUE, entries("later", 1))
    later.close()
    set_user_version(path, FILE_FORMAT + 1)
    # when this version opens it
    with pytest.raises(BrokerError) as refused:
        SqliteBroker(str(path))
    # then it is refused naming the file, its version and what to do
    message = str(refused.value)
    assert str(path) in message and f"format version {FILE_FORMAT + 1}" in message
    assert f"this shardq reads {FILE_FORMAT}" in message and "upgrade" in message
    # and the file is left as it was: its version and its job
    assert user_version(path) == FILE_FORMAT + 1
    set_user_version(path, FILE_FORMAT)
    broker = SqliteBroker(str(path))
    assert [b.split(":")[0] for b in drain(broker)] == ["later-0"]
    broker.close()


def test_a_file_of_other_tables_is_not_marked_when_refused_nor_when_shared(
    tmp_path: Path,
) -> None:
    # given an application's database that uses the file's version for itself
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    set_user_version(path, 42)
    # when the broker is pointed at it by mistake, then it is refused as another's file
    with pytest.raises(BrokerError, match="it holds other tables"):
        SqliteBroker(str(path))
    # and when it is shared on purpose, then the version stays the application's
    SqliteBroker(str(path), allow_other_tables=True).close()
    assert user_version(path) == 42


@pytest.mark.parametrize("version", [0, 3])
def test_an_application_s_table_named_as_shardq_s_is_called_another_s_whatever_its_version(
    tmp_path: Path, version: int
) -> None:
    # given an application's database with a table "messages" of its own, and its version
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, text TEXT)")
    set_user_version(path, version)
    # when the broker is pointed at it, then it is refused as another application's file
    with pytest.raises(BrokerError, match="its table 'messages' is another application's") as e:
        SqliteBroker(str(path))
    assert user_version(path) == version
    # or, with a version this shardq does not know, as a later shardq's maybe
    later = "(or a later shardq's: its format version is 3)"
    assert (later in str(e.value)) == (version == 3), str(e.value)


def test_a_shared_file_of_an_unknown_version_opened_without_the_flag_names_it(
    tmp_path: Path,
) -> None:
    # given a file shardq shares with an application, which set the version to its own
    path = tmp_path / "shared.db"
    SqliteBroker(f"{path}", allow_other_tables=True).close()
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    set_user_version(path, 42)
    # when it is opened without ?allow_other_tables=1, then the error names that flag too
    with pytest.raises(BrokerError, match=r"format version 42.*either.*allow_other_tables=1"):
        SqliteBroker(str(path))
    assert user_version(path) == 42


# -- URL options ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///x.db?nonsense=1",
        "memory://?allow_other_tables=1",
        "sqs://?test_reopen_groups=1",
    ],
)
def test_unknown_url_parameters_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="unknown parameter"):
        broker_from_url(url)


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("sqlite://host/x.db", "'host'"),
        ("sqlite:///x.db#backup", "'#backup'"),
        ("memory://name", "'name'"),
        ("sqs://user:secret@sqs.eu-west-1.amazonaws.com", "'user:***@sqs.eu-west-1.amazonaws.com'"),
    ],
)
def test_url_parts_that_would_be_ignored_are_refused(url: str, part: str) -> None:
    # given a broker URL with a host (or credentials) or a fragment, which no scheme
    # reads / when a broker is made of it / then it is refused naming the part (a
    # password hidden), not silently dropped: sqlite://host/x.db would open x.db here
    with pytest.raises(ConfigError, match=rf"^broker_url: {re.escape(part)} is not read"):
        broker_from_url(url)


def test_a_flag_that_is_not_1_or_0_is_refused() -> None:
    with pytest.raises(ConfigError, match="test_reopen_groups must be 1 or 0"):
        broker_from_url("memory://?test_reopen_groups=maybe")


def test_the_reopen_mode_is_set_from_the_url(tmp_path: Path) -> None:
    memory = broker_from_url("memory://?test_reopen_groups=1")
    plain = broker_from_url("memory://")
    on_file = broker_from_url(f"sqlite:///{tmp_path / 'b.db'}?test_reopen_groups=1")
    assert isinstance(memory, MemoryBroker) and memory.reopen_groups
    assert isinstance(plain, MemoryBroker) and not plain.reopen_groups
    assert isinstance(on_file, SqliteBroker) and on_file.reopen_groups
    for b in (memory, plain, on_file):
        b.close()


# -- the test-only group reopening mode -------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
@pytest.mark.parametrize("reopen", [True, False])
def test_reopen_mode_lets_a_released_later_message_overtake_a_hidden_one(
    tmp_path: Path, kind: str, reopen: bool
) -> None:
    broker: SqliteBroker = (
        SqliteBroker(str(tmp_path / "b.db"), reopen_groups=reopen)
        if kind == "sqlite"
        else MemoryBroker(reopen_groups=reopen)
    )
    broker.ensure_queue(QUEUE)
    broker.send_batch(QUEUE, [SendEntry(str(i), f"m{i}", "g", f"d{i}") for i in (1, 2)])
    # given messages 1 and 2 of a group in flight
    _first, second = broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=60)
    # when 2 is released while 1 stays hidden
    assert not broker.change_visibility_batch(QUEUE, [(second.receipt, 0)]).failed
    got = broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=60)
    # then with the mode on 2 is received before 1 (the emulated defect); off, it is not
    assert [m.body for m in got] == (["m2"] if reopen else [])
    # and a receive that returned a message of the group blocks it again
    assert broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=60) == []
    broker.close()


# -- disk housekeeping --------------------------------------------------------------


def test_maintain_gives_the_space_of_a_drained_backlog_back(tmp_path: Path) -> None:
    # given a fresh file, then 5,000 messages published and drained
    path = tmp_path / "b.db"
    broker = SqliteBroker(str(path))
    broker.ensure_queue(QUEUE)
    broker.maintain()
    fresh = file_bytes(path)
    for n in range(500):
        broker.send_batch(QUEUE, entries(f"m{n}", size=400))
    assert len(drain(broker)) == 5000
    grown = file_bytes(path)
    # and their deduplication ids expired
    expire_dedup_ids(broker)
    # when the broker is maintained
    broker.maintain()
    # then the file and its WAL are back near their fresh size
    assert grown > 3 * fresh + 2**20
    assert file_bytes(path) <= 3 * fresh + 64 * 1024
    assert dedup_tables(broker) == 0
    broker.close()


def test_maintain_checkpoints_the_wal_even_when_its_writes_fail(tmp_path: Path) -> None:
    # given a file whose WAL holds a drained backlog's pages (maintain would give them back)
    path = tmp_path / "b.db"
    broker = SqliteBroker(str(path))
    broker.ensure_queue(QUEUE)
    for n in range(50):
        broker.send_batch(QUEUE, entries(f"m{n}", size=400))
    assert len(drain(broker)) == 500
    assert os.path.getsize(f"{path}-wal") > 0
    # and a connection that can write no more (when the file's size is limited the WAL
    # cannot grow: only a checkpoint lets writes go on; on a disk with no room at all it
    # cannot copy the WAL into the file either)
    with broker._file.read("refusing writes") as db:
        db.execute("PRAGMA query_only = ON")
    # when the broker is maintained
    with pytest.raises(BrokerError):
        broker.maintain()
    # then its writes failed, and the WAL was still checkpointed and truncated
    assert os.path.getsize(f"{path}-wal") == 0
    broker.close()


def test_maintain_keeps_deduplication_ids_still_in_their_window(broker: SqliteBroker) -> None:
    result = broker.send_batch(QUEUE, [SendEntry("0", "once", "g", "same")])
    drain(broker)
    broker.maintain()
    again = broker.send_batch(QUEUE, [SendEntry("0", "once", "g", "same")])
    assert again.message_ids == result.message_ids
    assert drain(broker) == []


def test_compact_shrinks_a_file_made_without_incremental_vacuum(tmp_path: Path) -> None:
    # given a file created the way older versions did (no auto_vacuum), with a drained backlog
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA auto_vacuum = NONE")
        db.execute(
            "CREATE TABLE queues (name TEXT PRIMARY KEY, visibility_timeout REAL NOT NULL,"
            " max_message_bytes INTEGER NOT NULL, version INTEGER NOT NULL DEFAULT 0)"
        )
    broker = SqliteBroker(str(path))
    broker.ensure_queue(QUEUE)
    for n in range(300):
        broker.send_batch(QUEUE, entries(f"m{n}", size=400))
    drain(broker)
    expire_dedup_ids(broker)
    broker.maintain()
    broker.close()
    before = file_bytes(path)
    # when it is compacted by hand
    compact(str(path))
    # then it shrank, and maintenance can shrink it from now on
    assert file_bytes(path) < before / 4
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2


def test_a_node_on_a_full_disk_keeps_going_and_recovers_when_room_returns(
    tmp_path: Path,
) -> None:
    # given a node running on a file that may not grow, with jobs queued before it filled
    broker = SqliteBroker(str(tmp_path / "broker.db"))
    app = shardq.App(shardq.Config(idle_wait_seconds=1, grace_seconds=5))
    app.configure(broker=broker)
    done: list[int] = []

    @app.register
    class Job(shardq.Worker):
        shards = 2

        def perform(self, entity_id: str, payloads: list[int]) -> None:
            done.extend(payloads)

    app.ensure_queues()
    Job.publish_many([(f"e{n % 7}", n) for n in range(300)])
    limit_file(broker, 0)
    node = app.node(app.plan(threads=2), until_empty=True)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        # when it runs with no room until it met the full file twice (it kept trying),
        # then room returns
        runner.start()

        def full_seen() -> int:
            return sum("is full" in str(e.get("error", "")) for e in list(logs))

        deadline = time.monotonic() + 60
        while full_seen() < 2 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        full = list(logs)
        limit_file(broker, None)
        runner.join(60)
    # then it kept running, said why it could not work, and ran every job once, in order
    assert not runner.is_alive()
    assert sum("is full" in str(e.get("error", "")) for e in full) >= 2
    assert not any(e["event"] == "node.part_failed" for e in logs)
    assert sorted(done) == list(range(300))
    for entity in range(7):
        mine = [n for n in done if n % 7 == entity]
        assert mine == sorted(mine)
    broker.close()


def test_a_file_of_the_previous_version_opens_and_keeps_its_groups(tmp_path: Path) -> None:
    # given a file as the previous version left it (no index of groups by id), with a group
    # whose first message is in flight and one more waiting behind it
    path = str(tmp_path / "b.db")
    old = SqliteBroker(path)
    old.ensure_queue(QUEUE)
    old.send_batch(QUEUE, [SendEntry(str(i), f"m{i}", "g", f"d{i}") for i in range(2)])
    (first,) = old.receive(QUEUE, max_messages=1, wait_seconds=0, visibility_timeout=60)
    with old._file.write("dropping the index") as db:
        db.execute("DROP INDEX groups_by_id")
    old.close()
    # when this version opens it
    broker = SqliteBroker(path)
    # then the group stays blocked until its first message is deleted, then goes on
    assert broker.receive(QUEUE, max_messages=10, wait_seconds=0, visibility_timeout=60) == []
    assert not broker.delete_batch(QUEUE, [first.receipt]).failed
    assert drain(broker) == ["m1"]
    with broker._file.read("inspecting it") as db:
        assert db.execute("SELECT 1 FROM sqlite_master WHERE name = 'groups_by_id'").fetchone()
    broker.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_waiting_receive_or_watch_on_a_closed_broker_raises_instead_of_returning_nothing(
    kind: str, tmp_path: Path
) -> None:
    # given a closed broker
    broker = MemoryBroker() if kind == "memory" else SqliteBroker(str(tmp_path / "b.db"))
    broker.ensure_queue("q.fifo")
    broker.close()
    # when a receive waits on it, or a watch, then each says the broker is closed at once
    started = time.monotonic()
    with pytest.raises(BrokerError, match="closed"):
        broker.receive("q.fifo", max_messages=1, wait_seconds=2, visibility_timeout=30)
    with pytest.raises(BrokerError, match="closed"):
        broker.watch(["q.fifo"], 2)
    assert time.monotonic() - started < 1.5


def test_maintain_on_a_closed_broker_raises_and_leaves_the_disk_alone(tmp_path: Path) -> None:
    # given a closed broker whose file was then removed
    path = tmp_path / "b.db"
    broker = SqliteBroker(str(path))
    broker.close()
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    # when it is maintained, then it says it is closed and makes no file
    with pytest.raises(BrokerError, match="closed"):
        broker.maintain()
    assert os.listdir(tmp_path) == []
