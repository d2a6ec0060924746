"""Damaged items (a hand edit, a damaged file) in every store that can be edited around
shardq: the embedded SQLite file and DynamoDB (on the ministack process)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardq.store import DamagedItem, SqliteStore, Store
from tests.emulator import Emulator


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.sqs)])
def damage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Damage]]:
    """A store holding item shard/W@0:1, and a way to overwrite its stored value with
    text as a damaged file or a hand edit would (around the store)."""
    if request.param == "sqlite":
        path = str(tmp_path / "broker.db")
        store: Store = SqliteStore(path)

        def overwrite(text: str | None) -> None:
            with sqlite3.connect(path) as db:
                update = "UPDATE shardq_state SET value = ? WHERE key = 'shard/W@0:1'"
                db.execute(update, ("" if text is None else text,))  # the column is NOT NULL

    else:
        from shardq.store.dynamo import DynamoStore

        server: Emulator = request.getfixturevalue("sqs_emulator")
        table = f"t{uuid.uuid4().hex[:12]}-shardq-state"
        store = dynamo = DynamoStore(table, region="us-east-1", endpoint_url=server.endpoint_url)
        dynamo.ensure_table()

        def overwrite(text: str | None) -> None:
            value = {} if text is None else {"value": {"S": text}}
            key = {"ns": {"S": "shard"}, "key": {"S": "shard/W@0:1"}, "version": {"N": "1"}}
            dynamo.client.put_item(TableName=table, Item={**key, **value})

    store.put("shard/W@0:1", {"owner": "a"}, version=None)
    yield store, overwrite
    store.close()


Damage = Callable[[str | None], None]


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '"text"', "null", None])
def test_a_damaged_item_is_an_error_naming_its_key(
    damage: tuple[Store, Damage], text: str | None
) -> None:
    # given an item whose value was overwritten with text that is not a JSON object, or
    # removed (a damaged file, a hand edit)
    store, overwrite = damage
    overwrite(text)
    # when it is read alone or in a query
    # then DamagedItem names the item and says what to do (no JSON or attribute error);
    # it is no StoreError, which nodes take for an outage that passes and retry
    for read in (lambda: store.get("shard/W@0:1"), lambda: store.query_all("shard/")):
        with pytest.raises(DamagedItem, match=r"item 'shard/W@0:1' is damaged.*fix or delete"):
            read()


def test_a_query_that_keeps_damaged_items_returns_them_empty_saying_why(
    damage: tuple[Store, Damage],
) -> None:
    # given a damaged item beside a sound one
    store, overwrite = damage
    overwrite("[1, 2]")
    store.put("shard/W@0:2", {"owner": "b"}, version=None)
    # when a query keeps damaged items
    got = store.query_all("shard/", keep_damaged=True)
    # then the damaged one comes back empty, at its version, saying why; the sound one whole
    assert [(i.key, dict(i.value), i.version) for i in got] == [
        ("shard/W@0:1", {}, 1),
        ("shard/W@0:2", {"owner": "b"}, 1),
    ]
    assert "an array, not a JSON object" in got[0].damaged and not got[1].damaged
    # and a write at that version replaces it (the way nodes repair one)
    assert store.put("shard/W@0:1", {"owner": "c"}, version=1).version == 2
    assert [dict(i.value) for i in store.query_all("shard/")] == [{"owner": "c"}, {"owner": "b"}]
