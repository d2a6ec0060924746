"""An elastic node (`shardq run` without --node) as a real child process."""

from __future__ import annotations

import signal

import pytest

from tests.apps import ledger
from tests.children import Env
from tests.conftest import needs_shared_store

pytestmark = pytest.mark.slow


def test_a_node_stopped_gracefully_frees_every_shard_and_deletes_its_heartbeat(env: Env) -> None:
    # given one elastic node owning every shard (3 shards) and keeping its heartbeat
    needs_shared_store(ledger.app)
    store = ledger.app.store
    node = env.node("--threads", "1")

    def owning_all() -> bool:
        owners = {i.value["owner"] for i in store.query_all("shard/")}
        return len(store.query_all("shard/")) == 3 and len(owners) == 1

    env.wait_for(owning_all)
    assert len(store.query_all("node/")) == 1
    # when it gets SIGTERM and exits
    node.send_signal(signal.SIGTERM)
    assert node.wait(30) == 0
    # then no ownership item and no heartbeat is left: another node takes the shards
    # at its next round, nothing waits for a lease to run out
    assert store.query_all("shard/") == [] and store.query_all("node/") == []
