"""The plan: which node and which thread own each shard (a pure function)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardq
from shardq.core.errors import ConfigError
from shardq.core.plan import Plan, ShardRef, all_shards, format_plan, make_plan

Workers = Mapping[str, tuple[int, int]]

#: name -> (shards, priority), as App.plan builds it.
workers_strategy = st.dictionaries(
    keys=st.sampled_from(["SyncOrder", "SendMail", "Reindex", "Bill", "Audit", "Zz"]),
    values=st.tuples(st.integers(1, 40), st.integers(1, 1000)),
    min_size=1,
)
nodes_strategy = st.integers(1, 8)
threads_strategy = st.integers(1, 12)


def every_plan(workers: Workers, nodes: int, threads: int) -> list[Plan]:
    return [make_plan(workers, node=n, nodes=nodes, threads=threads) for n in range(nodes)]


def spread(sizes: list[int]) -> int:
    return max(sizes) - min(sizes)


# -- ownership -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(workers=workers_strategy, nodes=nodes_strategy, threads=threads_strategy)
def test_every_shard_has_exactly_one_owner_thread(
    workers: Workers, nodes: int, threads: int
) -> None:
    # given any workers, number of nodes and threads per node
    # when every node's plan is made
    plans = every_plan(workers, nodes, threads)

    # then every shard of every worker is owned by exactly one thread of one node ...
    owners: Counter[tuple[str, int]] = Counter(
        (ref.worker, ref.shard) for plan in plans for refs in plan.threads for ref in refs
    )
    expected = {(name, shard) for name, (count, _) in workers.items() for shard in range(count)}
    assert set(owners) == expected
    assert all(times == 1 for times in owners.values()), owners.most_common(3)
    # ... each plan says which node it is, and carries the worker's priority
    for n, plan in enumerate(plans):
        assert (plan.node, plan.nodes) == (n, nodes)
        assert all(ref.priority == workers[ref.worker][1] for ref in plan.shards)


@settings(max_examples=200, deadline=None)
@given(workers=workers_strategy, nodes=nodes_strategy, threads=threads_strategy)
def test_nodes_and_threads_get_balanced_shares(workers: Workers, nodes: int, threads: int) -> None:
    # given any workers, number of nodes and threads per node
    # when every node's plan is made
    plans = every_plan(workers, nodes, threads)

    # then node shares differ by at most one shard ...
    assert spread([len(plan.shards) for plan in plans]) <= 1
    # ... and so do the threads of each node, none of which is planned empty
    for plan in plans:
        if plan.threads:
            assert spread([len(refs) for refs in plan.threads]) <= 1
            assert all(refs for refs in plan.threads)
            assert len(plan.threads) == min(threads, len(plan.shards))


@pytest.mark.parametrize(
    ("workers", "nodes", "threads"),
    [
        ({"A": (7, 1)}, 1, 1),
        ({"A": (7, 1)}, 3, 2),
        ({"SyncOrder": (8, 5), "SendMail": (3, 1), "Bill": (1, 100)}, 2, 4),
        ({"SyncOrder": (1000, 5), "Reindex": (17, 2)}, 5, 16),
    ],
)
def test_every_shard_has_one_owner_in_chosen_layouts(
    workers: Workers, nodes: int, threads: int
) -> None:
    # given a few explicit layouts
    # when every node's plan is made
    plans = every_plan(workers, nodes, threads)
    # then the owned shards are all the shards, each once
    owned = [ref for plan in plans for ref in plan.shards]
    assert sorted(owned, key=str) == sorted(all_shards(workers), key=str)
    assert len(owned) == len(set(owned)) == sum(count for count, _ in workers.values())


def test_shards_are_dealt_round_robin_by_worker_name_then_shard() -> None:
    # given two workers: B with 4 shards and A with 3 (A sorts first)
    workers = {"B": (4, 1), "A": (3, 9)}

    # when the plans of 2 nodes with 2 threads each are made
    plans = every_plan(workers, nodes=2, threads=2)

    # then the shards, ordered A[0..2] then B[0..3], go to node i % 2, and each
    # node's shards go to thread j % 2, so workers interleave on every thread
    def names(plan: Plan) -> list[list[str]]:
        return [[str(ref) for ref in refs] for refs in plan.threads]

    # (node 0: A[0], A[2], B[1], B[3]; node 1: A[1], B[0], B[2])
    assert names(plans[0]) == [["A[0]", "B[1]"], ["A[2]", "B[3]"]]
    assert names(plans[1]) == [["A[1]", "B[2]"], ["B[0]"]]


# -- determinism -------------------------------------------------------------------------


def test_the_same_input_gives_the_same_plan() -> None:
    # given a set of workers
    workers = {"SyncOrder": (8, 5), "SendMail": (3, 1), "Bill": (4, 100)}
    # when the plan is made twice
    first = every_plan(workers, nodes=3, threads=2)
    second = every_plan(dict(workers), nodes=3, threads=2)
    # then both are equal
    assert first == second


@settings(max_examples=100, deadline=None)
@given(
    workers=workers_strategy,
    nodes=nodes_strategy,
    threads=threads_strategy,
    seed=st.integers(0, 2**32 - 1),
)
def test_the_registration_order_of_workers_does_not_matter(
    workers: Workers, nodes: int, threads: int, seed: int
) -> None:
    # given the same workers registered in another order (dict order)
    names = list(workers)
    random.Random(seed).shuffle(names)
    reordered = {name: workers[name] for name in names}
    # when both plans are made
    # then they are the same, node by node and thread by thread
    assert every_plan(workers, nodes, threads) == every_plan(reordered, nodes, threads)


# -- threads and nodes without shards -----------------------------------------------------


def test_threads_beyond_the_shards_of_the_node_are_not_planned() -> None:
    # given 3 shards in all and a node with 8 threads
    workers = {"A": (2, 1), "B": (1, 1)}
    # when the plan of the only node is made
    plan = make_plan(workers, node=0, nodes=1, threads=8)
    # then only 3 threads are planned, one shard each
    assert len(plan.threads) == 3
    assert [len(refs) for refs in plan.threads] == [1, 1, 1]


def test_a_node_without_shards_has_an_empty_plan() -> None:
    # given 3 shards in all and 5 nodes
    workers = {"A": (2, 1), "B": (1, 1)}
    # when the plans of all five nodes are made
    plans = every_plan(workers, nodes=5, threads=4)
    # then nodes 3 and 4 own nothing
    assert [len(plan.shards) for plan in plans] == [1, 1, 1, 0, 0]
    for plan in plans[3:]:
        assert plan.threads == ()
        assert plan.shards == []
    # and format_plan says why
    text = format_plan(plans[3:])
    assert "node 3 of 5: 0 shards" in text
    assert "node 4 of 5: 0 shards" in text
    assert text.count("(no shards: more nodes than shards)") == 2
    assert "thread" not in text


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "nodes", "threads", "message"),
    [
        pytest.param(3, 3, 1, r"^--node must be from 0 to 2 .*got 3", id="node=nodes"),
        pytest.param(7, 3, 1, r"^--node must be from 0 to 2 .*got 7", id="node>nodes"),
        pytest.param(-1, 3, 1, r"^--node must be from 0 to 2 .*got -1", id="node<0"),
        pytest.param(0, 0, 1, r"^--nodes must be at least 1, got 0", id="nodes=0"),
        pytest.param(0, -2, 1, r"^--nodes must be at least 1, got -2", id="nodes<0"),
        pytest.param(0, 1, 0, r"^--threads must be at least 1, got 0", id="threads=0"),
        pytest.param(0, 1, -3, r"^--threads must be at least 1, got -3", id="threads<0"),
    ],
)
def test_bad_placement_is_a_config_error_naming_the_flag(
    node: int, nodes: int, threads: int, message: str
) -> None:
    # given valid workers
    workers = {"A": (4, 1)}
    # when the plan is asked for a bad node, number of nodes or threads
    # then a ConfigError names the command-line flag to fix
    with pytest.raises(ConfigError, match=message):
        make_plan(workers, node=node, nodes=nodes, threads=threads)


def test_no_workers_is_a_config_error() -> None:
    # given no registered workers
    # when a plan is made
    # then a ConfigError says so and points at --app
    with pytest.raises(ConfigError, match=r"no workers are registered.*--app"):
        make_plan({}, node=0, nodes=1, threads=1)


# -- format_plan ---------------------------------------------------------------------------


def test_format_plan_lists_nodes_threads_and_shards() -> None:
    # given the plans of two nodes with two threads each
    workers = {"SyncOrder": (4, 5), "SendMail": (2, 1)}
    plans = every_plan(workers, nodes=2, threads=2)

    # when they are formatted
    text = format_plan(plans)
    lines = text.splitlines()

    # then each node has a header and a line per thread naming its shards
    assert lines[0] == "node 0 of 2: 3 shards"
    assert "node 1 of 2: 3 shards" in lines
    assert sum(line.strip().startswith("thread 0:") for line in lines) == 2
    assert sum(line.strip().startswith("thread 1:") for line in lines) == 2
    for plan in plans:
        for refs in plan.threads:
            for ref in refs:
                assert str(ref) in text
    assert "SyncOrder[3]" in text
    assert "SendMail[1]" in text


def test_a_shard_ref_reads_as_worker_and_number() -> None:
    assert str(ShardRef("SyncOrder", 3, priority=5)) == "SyncOrder[3]"


# -- App.plan ------------------------------------------------------------------------------


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


@pytest.fixture
def broker() -> Iterator[shardq.MemoryBroker]:
    instance = shardq.MemoryBroker()
    try:
        yield instance
    finally:
        instance.close()


def test_app_plan_uses_the_workers_settings_with_config_overrides(
    broker: shardq.MemoryBroker,
) -> None:
    # given an app whose config gives X 5 shards (the class says 2) and 3 threads,
    # and a worker Y with its class settings
    app = shardq.App(
        shardq.Config(workers={"X": {"shards": 5, "priority": 7}}, threads=3), broker=broker
    )
    app.register(type("X", (shardq.Worker,), {"perform": _perform, "shards": 2}))
    app.register(type("Y", (shardq.Worker,), {"perform": _perform, "shards": 1, "priority": 4}))

    # when the app makes the plan of its only node, and of node 1 of 2 with 1 thread
    plan = app.plan()
    second = app.plan(node=1, nodes=2, threads=1)

    # then the plan uses the effective settings: X has 5 shards of priority 7, and the
    # config's 3 threads are planned
    assert plan == make_plan({"X": (5, 7), "Y": (1, 4)}, node=0, nodes=1, threads=3)
    assert sorted(str(ref) for ref in plan.shards) == [
        "X[0]",
        "X[1]",
        "X[2]",
        "X[3]",
        "X[4]",
        "Y[0]",
    ]
    assert {ref.priority for ref in plan.shards if ref.worker == "X"} == {7}
    assert len(plan.threads) == 3
    # and explicit placement arguments are passed through
    assert second == make_plan({"X": (5, 7), "Y": (1, 4)}, node=1, nodes=2, threads=1)
    assert (second.node, second.nodes, len(second.threads)) == (1, 2, 1)


def test_app_plan_with_no_workers_is_a_config_error(broker: shardq.MemoryBroker) -> None:
    # given an app with no workers
    app = shardq.App(shardq.Config(), broker=broker)
    # when its plan is made
    # then a ConfigError says no workers are registered
    with pytest.raises(ConfigError, match="no workers are registered"):
        app.plan()
