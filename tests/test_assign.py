"""Which node should hold each shard of an elastic fleet, with plain data.

Table tests of small fleets, then properties over fleets hypothesis makes up (balance,
determinism, stability, fewest moves against brute force) and over seeded random fleets
that gain or lose a node (how many shards change hands).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import combinations, product

from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core.assign import ShardKey, assign

Targets = dict[ShardKey, str]


def every_key(shards: Mapping[str, int]) -> set[ShardKey]:
    return {(worker, shard) for worker, count in shards.items() for shard in range(count)}


def per_node(targets: Targets, worker: str | None = None) -> Counter[str]:
    return Counter(node for (w, _), node in targets.items() if worker in (None, w))


def between(value: int, total: int, n: int) -> bool:
    """Whether ``value`` is floor(total / n) or ceil(total / n)."""
    return total // n <= value <= -(-total // n)


def assert_balanced(shards: Mapping[str, int], nodes: Sequence[str], targets: Targets) -> None:
    live = set(nodes)
    assert set(targets) == every_key(shards)
    assert set(targets.values()) <= live
    for worker, count in shards.items():
        mine = per_node(targets, worker)
        assert all(between(mine[node], count, len(live)) for node in live), (worker, mine)
    totals = per_node(targets)
    assert all(between(totals[node], sum(shards.values()), len(live)) for node in live), totals


def moves(before: Mapping[ShardKey, str], after: Targets) -> int:
    """Shards whose target is not their holder (unheld shards count: they move too)."""
    return sum(1 for key, node in after.items() if before.get(key) != node)


def owned(targets: Targets, node: str) -> int:
    return sum(1 for n in targets.values() if n == node)


# -- small fleets ---------------------------------------------------------------------


def test_one_node_holds_every_shard() -> None:
    # given one live node and nobody holding anything
    shards = {"Orders": 3, "Mail": 2}
    # when shards are assigned
    targets = assign(shards, ["n1"], {})
    # then that node holds them all
    assert targets == dict.fromkeys(every_key(shards), "n1")


def test_more_nodes_than_shards_gives_no_node_two_shards() -> None:
    # given 4 shards of two workers and 5 nodes
    shards = {"A": 2, "B": 2}
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    # when shards are assigned
    targets = assign(shards, nodes, {})
    # then 4 different nodes hold one each: the extra places of B go to other nodes than A's
    assert sorted(per_node(targets).values()) == [1, 1, 1, 1]
    assert_balanced(shards, nodes, targets)


def test_three_nodes_and_eight_shards_of_three_workers() -> None:
    # given 3 workers of 8 shards each and 3 nodes
    shards = {"A": 8, "B": 8, "C": 8}
    nodes = ["n1", "n2", "n3"]
    # when shards are assigned
    targets = assign(shards, nodes, {})
    # then each worker is split 3, 3, 2 and each node holds 8 in all
    for worker in shards:
        assert sorted(per_node(targets, worker).values()) == [2, 3, 3]
    assert per_node(targets) == {"n1": 8, "n2": 8, "n3": 8}


def test_a_leaving_node_hands_over_only_its_shards() -> None:
    # given a balanced fleet of 3 nodes
    shards = {"A": 8, "B": 8, "C": 8}
    before = assign(shards, ["n1", "n2", "n3"], {})
    # when n3 leaves
    after = assign(shards, ["n1", "n2"], before)
    # then only n3's 8 shards move, and the two others hold 12 each (4 of each worker)
    assert moves(before, after) == 8
    assert all(after[key] == node for key, node in before.items() if node != "n3")
    assert per_node(after) == {"n1": 12, "n2": 12}
    assert_balanced(shards, ["n1", "n2"], after)


def test_a_joining_node_takes_its_share_and_nothing_else_moves() -> None:
    # given a balanced fleet of 3 nodes
    shards = {"A": 8, "B": 8, "C": 8}
    before = assign(shards, ["n1", "n2", "n3"], {})
    # when n4 joins
    after = assign(shards, ["n1", "n2", "n3", "n4"], before)
    # then n4 gets 6 shards (2 of each worker), and those are the only ones that move
    assert per_node(after)["n4"] == 6
    assert all(after[key] == "n4" for key in after if after[key] != before[key])
    assert moves(before, after) == 6
    assert_balanced(shards, ["n1", "n2", "n3", "n4"], after)


def test_shards_of_a_node_that_is_gone_are_given_to_live_nodes() -> None:
    # given shards 1 and 3 held by a node that is not live any more
    holders = {("A", 0): "a", ("A", 1): "gone", ("A", 2): "b", ("A", 3): "gone"}
    # when shards are assigned over the live nodes
    targets = assign({"A": 4}, ["a", "b"], holders)
    # then the live holders keep theirs and the free shards fill both up to 2
    assert targets[("A", 0)] == "a" and targets[("A", 2)] == "b"
    assert per_node(targets) == {"a": 2, "b": 2}


def test_a_node_over_its_quota_keeps_its_lowest_shards() -> None:
    # given one node holding all 6 shards of a worker, and 3 live nodes
    holders = {("A", shard): "a" for shard in range(6)}
    # when shards are assigned
    targets = assign({"A": 6}, ["a", "b", "c"], holders)
    # then a keeps shards 0 and 1, and b and c get two of the others each
    assert sorted(s for (_, s), node in targets.items() if node == "a") == [0, 1]
    assert per_node(targets) == {"a": 2, "b": 2, "c": 2}


def test_extra_places_go_to_nodes_that_already_hold_them() -> None:
    # given 5 shards over 2 nodes where b holds 3 (one more than the floor)
    holders = {("A", 0): "a", ("A", 1): "b", ("A", 2): "b", ("A", 3): "a", ("A", 4): "b"}
    # when shards are assigned
    targets = assign({"A": 5}, ["a", "b"], holders)
    # then nothing moves: b keeps the extra place
    assert targets == holders


def test_no_live_node_gives_no_targets() -> None:
    assert assign({"A": 3}, [], {("A", 0): "n1"}) == {}


def test_a_worker_with_no_shards_gets_no_keys() -> None:
    targets = assign({"A": 0, "B": 1}, ["n1", "n2"], {})
    assert set(targets) == {("B", 0)}


def test_holders_of_unknown_workers_or_shards_are_ignored() -> None:
    # given holders naming a worker that is not in shards and a shard out of range
    noise = {("Gone", 0): "n1", ("A", 7): "n1", ("A", -1): "n2"}
    # when shards are assigned with and without them
    # then the answer is the same and has no key for them
    assert assign({"A": 3}, ["n1", "n2"], noise) == assign({"A": 3}, ["n1", "n2"], {})


def test_the_same_snapshot_gives_the_same_targets_in_another_process() -> None:
    # given a snapshot with free shards (placed by hashing)
    shards = {"Orders": 40, "Mail": 7}
    nodes = [f"node-{i}" for i in range(6)]
    holders = {("Orders", shard): "node-1" for shard in range(20)}
    here = assign(shards, nodes, holders)
    program = (
        "import json, sys\n"
        "from shardq.core.assign import assign\n"
        f"targets = assign({shards!r}, {nodes!r}, {holders!r})\n"
        "json.dump(sorted([*k, v] for k, v in targets.items()), sys.stdout)\n"
    )
    for seed in ("1", "2"):
        # when another Python process with another string-hash seed computes it
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", program], env=env, check=True, capture_output=True, text=True
        ).stdout
        # then it gets exactly the same targets
        assert {(w, n): v for w, n, v in json.loads(out)} == here


# -- properties ---------------------------------------------------------------------------

#: Node ids from a small pool (some with colons, some non-ASCII), so fleets overlap.
NODE_POOL = ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "host:9000", "ñ", "node-10"]
WORKERS = ["A", "B", "C", "ns:D"]


@st.composite
def fleets(
    draw: st.DrawFn, max_nodes: int = 8, max_workers: int = 4, max_shards: int = 30
) -> tuple[dict[str, int], list[str], dict[ShardKey, str]]:
    """``(shards, nodes, holders)``: holders mix live nodes, gone nodes, unheld shards and
    keys of unknown workers or out-of-range shards."""
    workers = draw(st.lists(st.sampled_from(WORKERS), max_size=max_workers, unique=True))
    shards = {w: draw(st.integers(0, max_shards)) for w in workers}
    nodes = draw(st.lists(st.sampled_from(NODE_POOL[:max_nodes]), max_size=max_nodes, unique=True))
    anyone = st.sampled_from([*nodes, "gone-1", "gone-2"])
    holders: dict[ShardKey, str] = {}
    for key in sorted(every_key(shards)):
        if draw(st.booleans()):
            holders[key] = draw(anyone)
    for _ in range(draw(st.integers(0, 3))):
        worker = draw(st.sampled_from([*WORKERS, "Unknown"]))
        holders[(worker, draw(st.integers(-2, max_shards + 2)))] = draw(anyone)
    return shards, nodes, holders


Fleet = tuple[dict[str, int], list[str], dict[ShardKey, str]]


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_every_shard_goes_to_a_live_node_and_every_node_gets_its_share(fleet: Fleet) -> None:
    shards, nodes, holders = fleet
    targets = assign(shards, nodes, holders)
    if not nodes:
        assert targets == {}
    else:
        assert_balanced(shards, nodes, targets)


@settings(max_examples=100, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_the_order_of_nodes_and_holders_does_not_matter(fleet: Fleet, rng: random.Random) -> None:
    # given the same snapshot, nodes shuffled (one listed twice) and holders re-inserted
    # in another order
    shards, nodes, holders = fleet
    shuffled = nodes + nodes[:1]
    rng.shuffle(shuffled)
    items = list(holders.items())
    rng.shuffle(items)
    # when both are assigned
    # then the targets are the same
    assert assign(shards, shuffled, dict(items)) == assign(shards, nodes, holders)


@settings(max_examples=100, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_a_balanced_holding_is_kept_as_it_is(fleet: Fleet, rng: random.Random) -> None:
    shards, nodes, holders = fleet
    targets = assign(shards, nodes, holders)
    # given the targets held as computed: nothing moves on the next round
    assert assign(shards, nodes, targets) == targets
    # given another balanced holding (the node names permuted): nothing moves either
    names = nodes[:]
    rng.shuffle(names)
    permuted = {key: dict(zip(nodes, names, strict=True))[node] for key, node in targets.items()}
    assert assign(shards, nodes, permuted) == permuted


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_a_live_holder_keeps_its_lowest_shards_up_to_its_quota(fleet: Fleet) -> None:
    shards, nodes, holders = fleet
    targets = assign(shards, nodes, holders)
    for worker, count in shards.items():
        for node in nodes:
            mine = [s for s in range(count) if holders.get((worker, s)) == node]
            kept = [s for s in mine if targets[(worker, s)] == node]
            quota = per_node(targets, worker)[node]
            assert kept == mine[: min(len(mine), quota)]


def fewest_moves(shards: dict[str, int], nodes: list[str], holders: dict[ShardKey, str]) -> int:
    """Brute force: the fewest shards any balanced assignment moves (every choice of the
    nodes that get ceil(S/N) of each worker, kept if the totals are balanced)."""
    n, total = len(nodes), sum(shards.values())
    held = Counter(
        (w, node) for w, c in shards.items() for s in range(c) if (node := holders.get((w, s)))
    )
    best = 0
    for extras in product(*(combinations(nodes, c % n) for c in shards.values())):
        quota = {
            (w, node): c // n + (node in extra)
            for (w, c), extra in zip(shards.items(), extras, strict=True)
            for node in nodes
        }
        totals = Counter({node: sum(quota[(w, node)] for w in shards) for node in nodes})
        if all(between(totals[node], total, n) for node in nodes):
            best = max(best, sum(min(held[key], q) for key, q in quota.items()))
    return total - best


@settings(max_examples=150, deadline=None)
@given(fleets(max_nodes=5, max_workers=3, max_shards=9))
def test_no_balanced_assignment_moves_fewer_shards(fleet: Fleet) -> None:
    shards, nodes, holders = fleet
    if nodes:
        assert moves(holders, assign(shards, nodes, holders)) == fewest_moves(
            shards, nodes, holders
        )


# -- larger random snapshots (many conflicting holdings) ----------------------------------


def test_larger_random_snapshots_are_balanced_and_then_kept() -> None:
    for seed in range(200):
        # given up to 8 workers and 16 nodes, shards held at random
        rng = random.Random(seed)
        shards, nodes, holders = random_snapshot(rng, workers=rng.randint(1, 8))
        # when shards are assigned
        targets = assign(shards, nodes, holders)
        # then the targets are balanced, and the next round keeps them as they are
        assert_balanced(shards, nodes, targets)
        assert assign(shards, nodes, targets) == targets, seed


def test_larger_random_snapshots_do_not_depend_on_the_order_of_nodes_or_holders() -> None:
    for seed in range(200):
        # given a random snapshot, and the same with nodes and holders in another order
        rng = random.Random(seed)
        shards, nodes, holders = random_snapshot(rng, workers=rng.randint(1, 8))
        items = list(holders.items())
        rng.shuffle(items)
        # when both are assigned
        # then the targets are the same
        assert assign(shards, nodes[::-1], dict(items)) == assign(shards, nodes, holders), seed


# -- a node joins or leaves -----------------------------------------------------------------


def random_snapshot(
    rng: random.Random, workers: int
) -> tuple[dict[str, int], list[str], dict[ShardKey, str]]:
    """Random shards and nodes (up to 16), most shards held by a random live node."""
    shards = {f"W{i}": rng.choice([rng.randint(0, 12), rng.randint(0, 80)]) for i in range(workers)}
    nodes = [f"node-{i}" for i in rng.sample(range(40), rng.randint(2, 16))]
    holders = {key: rng.choice(nodes) for key in every_key(shards) if rng.random() < 0.8}
    return shards, nodes, holders


def random_fleet(rng: random.Random, workers: int) -> tuple[dict[str, int], list[str], Targets]:
    """A random fleet and a balanced assignment of it (from random holders)."""
    shards, nodes, holders = random_snapshot(rng, workers)
    return shards, nodes, assign(shards, nodes, holders)


def join_or_leave(rng: random.Random, nodes: list[str]) -> tuple[list[str], str, str]:
    """The fleet after one node joins or leaves, the kind of change, and that node."""
    if rng.random() < 0.5:
        gone = rng.choice(nodes)
        return [n for n in nodes if n != gone], "leave", gone
    return [*nodes, "newcomer"], "join", "newcomer"


def test_with_one_worker_a_join_or_a_leave_moves_only_the_shards_it_must() -> None:
    for seed in range(300):
        # given a balanced fleet with one worker
        rng = random.Random(seed)
        shards, nodes, before = random_fleet(rng, workers=1)
        # when one node joins or leaves
        fleet, kind, node = join_or_leave(rng, nodes)
        after = assign(shards, fleet, before)
        # then the leaver's shards move, or the newcomer's share, and nothing else
        must = owned(before, node) if kind == "leave" else owned(after, node)
        assert moves(before, after) == must, (seed, kind)


def test_a_join_or_a_leave_moves_few_more_shards_than_the_newcomer_or_leaver_has() -> None:
    # Keeping the totals balanced can force a few moves between nodes that stay (a node
    # holding the extra shard of two workers when the new fleet leaves room for one
    # extra per node); test_no_balanced_assignment_moves_fewer_shards shows they are
    # forced. Tolerance: one per worker with ceil places (S % N != 0) in the new fleet;
    # over 20 000 random fleets (up to 10 workers, 40 nodes) none needed more, and 97%
    # needed none.
    fleets_with_extra_moves = 0
    for seed in range(300):
        # given a balanced fleet with several workers
        rng = random.Random(seed)
        shards, nodes, before = random_fleet(rng, workers=rng.randint(2, 8))
        # when one node joins or leaves
        fleet, kind, node = join_or_leave(rng, nodes)
        after = assign(shards, fleet, before)
        # then at most the tolerance more than the leaver's shards or the newcomer's
        # share moves, and most changes move no more than that
        must = owned(before, node) if kind == "leave" else owned(after, node)
        if kind == "join":
            assert must <= -(-sum(shards.values()) // len(fleet))
        tolerance = sum(1 for count in shards.values() if count % len(fleet))
        assert must <= moves(before, after) <= must + tolerance, (seed, kind)
        fleets_with_extra_moves += moves(before, after) > must
    assert fleets_with_extra_moves <= 15  # 4 of these 300 fleets
