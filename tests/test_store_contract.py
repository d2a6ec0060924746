"""The state store contract, run on every implementation: memory, the embedded SQLite
file and DynamoDB (on the ministack process)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardq.broker import MemoryBroker, SqliteBroker
from shardq.core.config import Config
from shardq.core.errors import BrokerError, ConfigError
from shardq.store import (
    MemoryStore,
    SqliteStore,
    Store,
    StoreConflict,
    StoreError,
    store_for,
)
from shardq.store.base import MAX_KEY_BYTES, MAX_QUERY_ITEMS, MAX_VALUE_BYTES
from tests.emulator import Emulator

STORE_KINDS = ["memory", "sqlite", pytest.param("dynamodb", marks=pytest.mark.sqs)]


@pytest.fixture(params=STORE_KINDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens one more store on the same data (memory: the same store again)."""
    opened: list[Store] = []
    if request.param == "memory":
        shared = MemoryStore()
        opened.append(shared)

        def open_store() -> Store:
            return shared

    elif request.param == "sqlite":
        path = str(tmp_path / "broker.db")

        def open_store() -> Store:
            opened.append(SqliteStore(path))
            return opened[-1]

    else:
        from shardq.store.dynamo import DynamoStore

        server: Emulator = request.getfixturevalue("sqs_emulator")
        table = f"t{uuid.uuid4().hex[:12]}-shardq-state"

        def open_store() -> Store:
            opened.append(DynamoStore(table, region="us-east-1", endpoint_url=server.endpoint_url))
            return opened[-1]

        assert open_store().ensure_table() is True  # type: ignore[attr-defined]
    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Callable[[], Store]) -> Store:
    return opener()


def test_put_if_absent_then_get(store: Store) -> None:
    assert store.get("node/a") is None
    written = store.put("node/a", {"n": 1, "list": [1, "x", None]}, version=None)
    assert (written.version, dict(written.value)) == (1, {"n": 1, "list": [1, "x", None]})
    found = store.get("node/a")
    assert found is not None
    assert (found.key, found.version, dict(found.value)) == ("node/a", 1, written.value)
    with pytest.raises(StoreConflict, match="expected absent but is at version 1"):
        store.put("node/a", {"n": 2}, version=None)
    assert store.get("node/a") == found


def test_put_if_version(store: Store) -> None:
    store.put("shard/W@0:1", {"owner": "a"}, version=None)
    assert store.put("shard/W@0:1", {"owner": "b"}, version=1).version == 2
    with pytest.raises(StoreConflict):
        store.put("shard/W@0:1", {"owner": "c"}, version=1)  # stale
    with pytest.raises(StoreConflict):
        store.put("shard/W@0:2", {"owner": "c"}, version=1)  # no such item
    item = store.get("shard/W@0:1")
    assert item is not None and (item.version, item.value["owner"]) == (2, "b")
    assert store.get("shard/W@0:2") is None


def test_delete_with_and_without_version(store: Store) -> None:
    store.put("layout/A", {}, version=None)
    store.put("layout/B", {}, version=None)
    store.put("layout/B", {"x": 1}, version=1)
    assert store.delete("layout/A") is True
    assert store.delete("layout/A") is False
    assert store.get("layout/A") is None
    with pytest.raises(StoreConflict):
        store.delete("layout/B", version=1)
    assert store.get("layout/B") is not None
    with pytest.raises(StoreConflict):
        store.delete("layout/A", version=1)  # gone
    assert store.delete("layout/B", version=2) is True
    assert store.get("layout/B") is None
    assert store.put("layout/B", {}, version=None).version == 1  # a new item starts again


def test_query_by_prefix_in_key_order(store: Store) -> None:
    keys = ["node/b", "node/a", "node/c", "nodes/a", "node0/a", "nod/a", "morgue/W/1"]
    for key in keys:
        store.put(key, {"k": key}, version=None)
    assert [i.key for i in store.query("node/")] == ["node/a", "node/b", "node/c"]
    assert [i.value["k"] for i in store.query("node/")] == ["node/a", "node/b", "node/c"]
    assert [i.key for i in store.query("node/", start_after="node/a")] == ["node/b", "node/c"]
    assert [i.key for i in store.query("node/", start_after="node/a0")] == ["node/b", "node/c"]
    assert [i.key for i in store.query("node/", limit=2)] == ["node/a", "node/b"]
    assert [i.key for i in store.query("node/", start_after="a")] == ["node/a", "node/b", "node/c"]
    assert store.query("node/", start_after="node/c") == []
    assert store.query("node/", start_after="zzz") == []
    assert store.query("shard/") == []
    assert [i.key for i in store.query("morgue/W/")] == ["morgue/W/1"]
    assert [i.key for i in store.query("node/b")] == ["node/b"]


def test_query_pages_and_query_all_past_one_page(store: Store) -> None:
    total = MAX_QUERY_ITEMS + 3
    with ThreadPoolExecutor(8) as writers:  # the order of the writes does not matter here
        list(
            writers.map(
                lambda n: store.put(f"morgue/W/{n:05d}", {"n": n}, version=None), range(total)
            )
        )
    store.put("morgue/X/00000", {}, version=None)
    first = store.query("morgue/W/")
    assert len(first) == MAX_QUERY_ITEMS
    rest = store.query("morgue/W/", start_after=first[-1].key)
    assert [i.value["n"] for i in rest] == [MAX_QUERY_ITEMS, MAX_QUERY_ITEMS + 1, total - 1]
    assert len(store.query("morgue/W/", limit=MAX_QUERY_ITEMS + 500)) == MAX_QUERY_ITEMS
    every = store.query_all("morgue/W/")
    assert [i.value["n"] for i in every] == list(range(total))


def test_empty_rest_and_unicode(store: Store) -> None:
    store.put("layout/", {"root": True}, version=None)
    key = "morgue/Zürich-注文/🎉-1"
    value = {"名前": "ünïcode ✓", "emoji": "🎉", "nested": {"ß": ["é"]}}
    store.put(key, value, version=None)
    store.put("morgue/Zürich-注文/🎉-2", {}, version=None)
    found = store.get(key)
    assert found is not None and dict(found.value) == value
    assert [i.key for i in store.query("morgue/Zürich-注文/")] == [
        key,
        "morgue/Zürich-注文/🎉-2",
    ]
    assert [i.key for i in store.query("morgue/Zürich-注文/🎉-1")] == [key]
    root = store.get("layout/")
    assert root is not None and root.value["root"] is True
    assert [i.key for i in store.query("layout/")] == ["layout/"]


def test_bad_keys_and_values_are_refused(store: Store) -> None:
    for call in (
        lambda: store.get("nonamespace"),
        lambda: store.put("/rest", {}, version=None),
        lambda: store.delete("plain"),
        lambda: store.query("node"),
    ):
        with pytest.raises(ValueError, match="has no namespace"):
            call()
    with pytest.raises(ValueError, match="is over 1024 bytes; shorten it"):
        store.put("morgue/" + "é" * 510, {}, version=None)
    longest = "morgue/" + "k" * (MAX_KEY_BYTES - len("morgue/"))
    assert store.put(longest, {}, version=None).key == longest
    with pytest.raises(ValueError, match="over 358400 bytes"):
        store.put("morgue/W/big", {"blob": "x" * MAX_VALUE_BYTES}, version=None)
    with pytest.raises(ValueError, match="not a JSON object"):
        store.put("morgue/W/bad", {"when": object()}, version=None)
    store.put("morgue/W/fits", {"blob": "x" * (MAX_VALUE_BYTES - 20)}, version=None)
    found = store.get("morgue/W/fits")
    assert found is not None and len(found.value["blob"]) == MAX_VALUE_BYTES - 20
    assert store.get("morgue/W/big") is None and store.get("morgue/W/bad") is None


def test_racing_compare_and_set_has_one_winner(opener: Callable[[], Store]) -> None:
    """Given one item at version 1 and eight writers, each with its own connection or
    client, when all write it at version 1 at once, then exactly one succeeds."""
    opener().put("shard/W@0:0", {"owner": None}, version=None)
    stores = [opener() for _ in range(8)]
    start = threading.Barrier(len(stores))
    won: list[int] = []
    lost: list[int] = []

    def claim(n: int) -> None:
        start.wait()
        try:
            stores[n].put("shard/W@0:0", {"owner": n}, version=1)
            won.append(n)
        except StoreConflict:
            lost.append(n)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(lost) == len(stores) - 1
    item = opener().get("shard/W@0:0")
    assert item is not None and (item.version, item.value["owner"]) == (2, won[0])


def _claim_in_process(path: str, n: int, start: object) -> bool:
    store = SqliteStore(path)
    start.wait()  # type: ignore[attr-defined]
    try:
        store.put("shard/W@0:0", {"owner": n}, version=1)
        return True
    except StoreConflict:
        return False
    finally:
        store.close()


def test_sqlite_processes_racing_on_one_item_have_one_winner(tmp_path: Path) -> None:
    """Given an item in the broker file, when four processes write it at version 1 at
    once, then exactly one succeeds and the item holds its value."""
    path = str(tmp_path / "broker.db")
    SqliteBroker(path).close()
    SqliteStore(path).put("shard/W@0:0", {"owner": None}, version=None)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(4)
        with context.Pool(4) as pool:
            results = pool.starmap(_claim_in_process, [(path, n, start) for n in range(4)])
    assert sorted(results) == [False, False, False, True]
    item = SqliteStore(path).get("shard/W@0:0")
    assert item is not None and (item.version, item.value["owner"]) == (2, results.index(True))


def test_sqlite_store_shares_the_broker_file(tmp_path: Path) -> None:
    """The state table lives in the broker's file: a broker opens the file again, and a
    store made for the broker sees what another wrote."""
    path = str(tmp_path / "broker.db")
    broker = SqliteBroker(path)
    store = store_for(Config(), broker)
    assert isinstance(store, SqliteStore) and store.path == path
    store.put("layout/W", {"generation": 1}, version=None)
    store.close()
    broker.close()
    again = SqliteBroker(path)  # a file with shardq_state is still a shardq file
    found = store_for(Config(), again).get("layout/W")
    assert found is not None and found.value == {"generation": 1}
    again.close()


def test_apps_of_different_prefixes_on_one_broker_file_keep_apart_states(tmp_path: Path) -> None:
    # given two apps on one embedded file, "dev-" and "test-", with the same worker names
    path = str(tmp_path / "broker.db")
    dev, test = (SqliteBroker(path), SqliteBroker(path))
    dev_store = store_for(Config(queue_prefix="dev-"), dev)
    test_store = store_for(Config(queue_prefix="test-"), test)
    # when one writes its layout and a dead job of worker W
    dev_store.put("layout/W", {"generation": 1}, version=None)
    dev_store.put("morgue/W/e/1", {"body": "{}"}, version=None)
    # then the other (and an app of the default prefix) sees neither
    default_store = store_for(Config(), SqliteBroker(path))
    for other in (test_store, default_store):
        assert other.get("layout/W") is None and other.query_all("morgue/") == []
    # and the file is still a shardq file with its tables (no ?allow_other_tables needed)
    SqliteBroker(path).close()
    with pytest.raises(ValueError, match="queue_prefix 'a b'"):
        SqliteStore(path, "a b")


def test_a_file_of_an_earlier_version_keeps_its_state_for_each_app_of_another_prefix(
    tmp_path: Path,
) -> None:
    # given a file of an earlier version: the state of its apps in shardq_state (the
    # layout of "a-"'s worker W, and what an app of prefix "a-b-" wrote)
    path = str(tmp_path / "broker.db")
    SqliteBroker(path).close()
    earlier = SqliteStore(path)
    earlier.put("layout/W", {"generation": 1}, version=None)
    earlier.put("layout/V", {"generation": 3}, version=None)
    # when the apps open it with this version, then each finds what it had
    for prefix in ("a-", "a-b-", ""):
        store = SqliteStore(path, prefix)
        assert [(i.key, i.value, i.version) for i in store.query_all("layout/")] == [
            ("layout/V", {"generation": 3}, 1),
            ("layout/W", {"generation": 1}, 1),
        ]
    # and from then on each keeps its own: a write of one is not seen by the others, nor
    # undone when it opens the file again
    SqliteStore(path, "a-").put("layout/W", {"generation": 2}, version=1)
    again = SqliteStore(path, "a-").get("layout/W")
    assert again is not None and again.value == {"generation": 2}
    for prefix in ("a-b-", ""):
        other = SqliteStore(path, prefix).get("layout/W")
        assert other is not None and other.value == {"generation": 1}


def test_an_app_taking_over_an_earlier_files_state_leaves_other_apps_dead_jobs_to_them(
    tmp_path: Path,
) -> None:
    # given a file of an earlier version whose one state table holds a dead job of queue
    # "a-W-0.fifo" and one, large (its body in pieces), of "b-W-0.fifo"
    from shardq import morgue
    from shardq.broker import Message

    path = str(tmp_path / "broker.db")
    SqliteBroker(path).close()
    for queue, body in (("a-W-0.fifo", "{}"), ("b-W-0.fifo", "x" * 700_000)):
        message = Message(queue, f"id-{queue}", "", body, "e", 1, 0.0, "0")
        record = morgue.record_for(message, morgue.REASON_MAX_RETRIES, RuntimeError("no"), 4)
        morgue.bury(SqliteStore(path), "W", [record])
    # when apps "a-" and "b-" open it with this version
    a, b = SqliteStore(path, "a-"), SqliteStore(path, "b-")
    # then each has its own dead job only, every piece of it, so one requeues it
    assert {i.value.get("source_queue") for i in a.query_all("morgue/W/e/")} == {"a-W-0.fifo"}
    assert {i.value.get("source_queue") for i in b.query_all("morgue/W/e/")} == {"b-W-0.fifo"}
    assert len(a.query_all("morgue/W/t/")) == len(b.query_all("morgue/W/t/")) == 1
    assert a.query_all("morgue/W/p/") == [] and len(b.query_all("morgue/W/p/")) >= 1
    # and the earlier table keeps both, as an app of the default prefix saw them
    assert len(SqliteStore(path).query_all("morgue/W/e/")) == 2


def test_prefixes_that_differ_only_in_case_are_refused_on_one_file(tmp_path: Path) -> None:
    # given an app "dev-" on an embedded file
    path = str(tmp_path / "broker.db")
    SqliteStore(path, "dev-").put("layout/W", {"generation": 1}, version=None)
    # when an app "Dev-" opens it, then it is refused: SQLite's table names ignore case
    with pytest.raises(StoreError, match="'Dev-' differs only in case"):
        SqliteStore(path, "Dev-")


def test_only_tables_named_for_a_queue_prefix_are_taken_for_state_tables(tmp_path: Path) -> None:
    # given a file with another application's table whose name ends in shardq_state
    path = str(tmp_path / "broker.db")
    with sqlite3.connect(path) as db:
        db.execute('CREATE TABLE "billing.shardq_state" (key TEXT, value TEXT, version INT)')
    # when a broker opens it, then the table is another application's: refused without
    # the option, shared with it
    with pytest.raises(BrokerError, match=r"holds other tables \(billing.shardq_state\)"):
        SqliteBroker(path)
    SqliteBroker(f"{path}", allow_other_tables=True).close()


def test_aws_clients_without_a_region_say_where_to_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given no AWS region anywhere boto3 looks
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    from shardq.broker.sqs import SqsBroker
    from shardq.core.errors import BrokerError
    from shardq.store.dynamo import DynamoStore

    # when an SQS broker or a DynamoDB store is made, then each says where to set one
    with pytest.raises(BrokerError, match="no AWS region for SQS: set `region` in shardq"):
        SqsBroker()
    with pytest.raises(StoreError, match="no AWS region for DynamoDB: set `region`, store_url"):
        DynamoStore("t", region=None, endpoint_url=None)


def test_aws_clients_given_a_region_of_another_form_name_the_region_settings() -> None:
    # given a region with spaces (from AWS_DEFAULT_REGION, or an app's code: a Config
    # refuses it)
    from shardq.broker.sqs import SqsBroker
    from shardq.core.errors import BrokerError
    from shardq.store.dynamo import DynamoStore

    # when an SQS broker or a DynamoDB store is made, then each says the region is not
    # valid and where it is set, not that boto3 could not load the credentials' settings
    with pytest.raises(BrokerError) as sqs:
        SqsBroker(region="us east 1")
    with pytest.raises(StoreError) as dynamo:
        DynamoStore("t", region="us east 1", endpoint_url=None)
    for raised in (sqs, dynamo):
        assert "its AWS region is not valid" in str(raised.value)
        assert "'us east 1'" in str(raised.value) and "SHARDQ_REGION" in str(raised.value)
        assert "AWS_PROFILE" not in str(raised.value)
    assert "store_url's ?region=" in str(dynamo.value)


def test_store_for_memory_broker_is_in_memory() -> None:
    assert store_for(Config(), MemoryBroker()).kind == "memory"


def test_closed_sqlite_store_says_so(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "broker.db"))
    store.close()
    with pytest.raises(StoreError, match="closed; make a new one"):
        store.get("node/a")


def test_store_url_parameters_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"unknown parameter.*bogus.*region, endpoint_url"):
        Config(store_url="dynamodb://?bogus=1")
    with pytest.raises(ConfigError, match="store_url: 'redis://h' is not supported"):
        Config(store_url="redis://h")
    loaded = Config.load(env={"SHARDQ_STORE_URL": "dynamodb://?table=abc"})
    assert loaded.store_url == "dynamodb://?table=abc"


@pytest.mark.sqs
def test_store_for_sqs_is_dynamodb_named_from_the_prefix(sqs_emulator: Emulator) -> None:
    """Given an sqs:// app, its store is the table {queue_prefix}shardq-state at the SQS
    endpoint; store_url may name another table and endpoint."""
    from shardq.broker.sqs import SqsBroker
    from shardq.store.dynamo import DynamoStore

    url = sqs_emulator.endpoint_url
    config = Config(broker_url="sqs://", region="us-east-1", endpoint_url=url, queue_prefix="p1-")
    broker = SqsBroker(region="us-east-1", endpoint_url=url)
    store = store_for(config, broker)
    assert isinstance(store, DynamoStore) and store.table == "p1-shardq-state"
    with pytest.raises(StoreError, match=r"p1-shardq-state.*run `shardq queues ensure`"):
        store.get("node/a")
    other = Config(
        broker_url="sqs://",
        region="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        store_url=f"dynamodb://?endpoint_url={url}&table=elsewhere-state",
    )
    moved = store_for(other, broker)
    assert isinstance(moved, DynamoStore) and moved.table == "elsewhere-state"
    assert moved.ensure_table() is True and moved.ensure_table() is False
    moved.put("node/a", {}, version=None)
    assert moved.get("node/a") is not None
    broker.close()


def test_a_reconfigured_app_gets_a_store_on_its_new_file(tmp_path: Path) -> None:
    """Given an app whose store is on one broker file, when it is configured with
    another broker_url, then its store is on the new file."""
    import shardq

    first, second = tmp_path / "one.db", tmp_path / "two.db"
    app = shardq.App(Config(broker_url=f"sqlite:///{first}"))
    app.store.put("layout/W", {"file": 1}, version=None)
    app.configure(Config(broker_url=f"sqlite:///{second}"))
    assert isinstance(app.store, SqliteStore) and app.store.path == str(second)
    assert app.store.get("layout/W") is None
    app.broker.close()


@pytest.mark.sqs
def test_a_put_retried_after_its_write_landed_is_not_a_conflict(sqs_emulator: Emulator) -> None:
    """Given a put whose first attempt is written but retried anyway (as when its answer
    is lost), when the retry fails its condition on the item the first attempt wrote,
    then the put succeeds; a put that finds another writer's item still conflicts."""
    from shardq.store.dynamo import DynamoStore

    store = DynamoStore(
        f"t{uuid.uuid4().hex[:12]}-shardq-state",
        region="us-east-1",
        endpoint_url=sqs_emulator.endpoint_url,
    )
    store.ensure_table()

    def retry_first_attempt(attempts: int, **_: object) -> float | None:
        return 0.0 if attempts == 1 else None  # retry at once, though it succeeded

    store.client.meta.events.register("needs-retry.dynamodb.PutItem", retry_first_attempt)
    assert store.put("shard/W@0:0", {"owner": "a"}, version=None).version == 1
    assert store.put("shard/W@0:0", {"owner": "b"}, version=1).version == 2
    item = store.get("shard/W@0:0")
    assert item is not None and (item.version, item.value["owner"]) == (2, "b")
    with pytest.raises(StoreConflict, match="expected at version 1 but is at version 2"):
        store.put("shard/W@0:0", {"owner": "c"}, version=1)
    store.close()


@pytest.mark.sqs
def test_a_dynamodb_query_all_of_one_full_page_is_one_request(sqs_emulator: Emulator) -> None:
    """Given exactly one page of items under a prefix (1,000 shards' owners, say), when
    they are all read, then DynamoDB gets one Query: its answer says there is no more."""
    from shardq.store.dynamo import DynamoStore

    store = DynamoStore(
        f"t{uuid.uuid4().hex[:12]}-shardq-state",
        region="us-east-1",
        endpoint_url=sqs_emulator.endpoint_url,
    )
    store.ensure_table()
    with ThreadPoolExecutor(8) as writers:
        keys = [f"shard/W:{n:04d}" for n in range(MAX_QUERY_ITEMS)]
        list(writers.map(lambda key: store.put(key, {"owner": "a"}, version=None), keys))
    queries: list[object] = []
    store.client.meta.events.register(
        "before-call.dynamodb.Query", lambda **call: queries.append(call)
    )
    assert [i.key for i in store.query_all("shard/")] == keys
    assert len(queries) == 1
    store.close()
