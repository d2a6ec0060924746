"""An elastic node (`shardq run` without --node) as a real child process."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

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
        owners = [i.value["owner"] for i in store.query_all("shard/")]
        return len(owners) == 3 and len(set(owners)) == 1 and owners[0] != ""

    env.wait_for(owning_all)
    assert len(store.query_all("node/")) == 1
    # when it gets SIGTERM and exits
    node.send_signal(signal.SIGTERM)
    assert node.wait(30) == 0
    # then every ownership item names nobody and no heartbeat is left: another node
    # takes the shards at its next round, nothing waits for a lease to run out
    assert [i.value["owner"] for i in store.query_all("shard/")] == ["", "", ""]
    assert store.query_all("node/") == []


@pytest.mark.sqs
def test_a_node_whose_wall_clock_is_120_s_off_shares_and_takes_over_like_the_others(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # (on SQS and DynamoDB: the embedded broker's file is one machine's clock by design)
    env = Env("sqs", tmp_path, request)
    # jobs hidden 10 s per receive: a node stalled on a loaded machine must not have a
    # running job received again by the other (this test is about clocks, not lapses)
    env.vars.update(
        SHARDQ_LEASE_SECONDS="10",
        SHARDQ_WORKERS__Ledgered__shards="6",
        SHARDQ_WORKERS__Ledgered__visibility_timeout="10",
    )
    ledger.app.configure(env.config())
    try:
        needs_shared_store(ledger.app)
        store = ledger.app.store

        def owners() -> Counter[str]:
            items = store.query_all("shard/")
            return Counter(str(i.value["owner"]) for i in items if i.value["owner"])

        def ended() -> int:  # jobs that ended at least once (a replay counts once)
            return len({(e[1], e[2]) for e in env.events() if e[0] == "end"})

        def nodes_by_pid() -> dict[int, str]:
            return {int(i.value["pid"]): i.key[5:] for i in store.query_all("node/")}

        # given a node, and a node whose wall clock runs 120 s ahead
        plain = env.node("--threads", "2")
        skewed = env.node("--threads", "2", skew=120.0)
        env.wait_for(lambda: sorted(owners().values()) == [3, 3] and len(nodes_by_pid()) == 2)
        # when jobs flow, then every one runs, in order per entity
        ledger.Ledgered.publish_many([(f"e{i % 12}", {"n": i // 12}) for i in range(60)])
        env.wait_for(lambda: ended() == 60, timeout=60)
        # when the plain node is killed, then the skewed one takes its shards within
        # the lease (its clock is never compared with anyone's)
        skewed_id = nodes_by_pid()[skewed.pid]
        plain.kill()
        plain.wait()
        env.wait_for(lambda: owners() == Counter({skewed_id: 6}), timeout=10 + 3)
        # when a plain node joins and the skewed one is killed, then the plain one takes all
        late = env.node("--threads", "2")
        env.wait_for(lambda: sorted(owners().values()) == [3, 3], timeout=30)
        late_id = nodes_by_pid()[late.pid]
        skewed.kill()
        skewed.wait()
        env.wait_for(lambda: owners() == Counter({late_id: 6}), timeout=10 + 3)
        ledger.Ledgered.publish_many([(f"e{i % 12}", {"n": 5 + i // 12}) for i in range(24)])
        env.wait_for(lambda: ended() == 84, timeout=60)
        # then nothing is lost, reordered or run at once; the only repeats are jobs a
        # killed node ran and had not deleted yet, replayed in order
        # (judged in the ledger's append order: the skewed node stamps its lines 120 s on)
        entries = [{**e, "t": i} for i, e in enumerate(ledger.read(env.ledger))]
        problems = ledger.check(
            entries,
            {f"e{i}": 7 for i in range(12)},
            killed={plain.pid, skewed.pid},
        )
        bad = ("lost", "order", "overlap", "bad_duplicates")
        assert not any(problems[kind] for kind in bad), problems
    finally:
        env.stop_all()
        ledger.app.broker.close()
