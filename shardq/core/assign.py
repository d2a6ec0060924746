"""Which live node should hold each shard: every node gets floor or ceil of each worker's
shards and of all shards, with the fewest moves; holders over quota keep their lowest
numbers; free shards go by rendezvous hashing. Deterministic (tests/test_assign.py)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

#: A shard as the balancer sees it: (worker or generation name, shard number).
ShardKey = tuple[str, int]

_MASK32 = 0xFFFFFFFF
#: Odd multiplier (2**32 / golden ratio): spreads CRC values, which are XOR-linear.
_SPREAD = 0x9E3779B1


def assign(
    shards: Mapping[str, int],
    nodes: Sequence[str],
    holders: Mapping[ShardKey, str],
) -> dict[ShardKey, str]:
    """Shard -> node over the live ``nodes`` (none: ``{}``) given the current ``holders``
    (entries for unknown workers, shards or nodes are ignored)."""
    counts = sorted((w, c) for w, c in shards.items() if c)
    live = sorted(set(nodes))
    if not live:
        return {}
    held = {worker: _holdings(worker, count, set(live), holders) for worker, count in counts}
    extras = _extras(counts, live, held)
    targets: dict[ShardKey, str] = {}
    for worker, count in counts:
        extra = extras.get(worker, ())
        quota = {node: count // len(live) + (node in extra) for node in live}
        targets.update(_place(worker, count, live, quota, held[worker]))
    return targets


def _holdings(
    worker: str, count: int, live: set[str], holders: Mapping[ShardKey, str]
) -> dict[str | None, list[int]]:
    """Live node -> the shards of ``worker`` it holds, ascending; ``None`` -> the others."""
    held: dict[str | None, list[int]] = {None: []}
    for shard in range(count):
        node = holders.get((worker, shard))
        held.setdefault(node if node in live else None, []).append(shard)
    return held


def _extras(
    counts: list[tuple[str, int]], live: list[str], held: dict[str, dict[str | None, list[int]]]
) -> dict[str, list[str]]:
    """Worker -> the nodes that get ceil(S/N) of its shards: S % N extra places, every
    node lo or lo + 1 of them in all (totals within one); dealt round the nodes, then
    moved until most go to nodes *wanting* them (holding over the floor: one move less)."""
    n = len(live)
    workers = [(worker, count) for worker, count in counts if count % n]
    rows = [count % n for _, count in workers]
    lo = sum(rows) // n
    wants = [
        [len(held[worker].get(node, ())) > count // n for node in live] for worker, count in workers
    ]
    picks: list[set[int]] = []
    start = 0  # deal the places round the nodes: each node gets lo or lo + 1 of them
    for r in rows:
        picks.append({(start + j) % n for j in range(r)})
        start = (start + r) % n
    _improve(picks, wants, n, lo)
    return {worker: [live[j] for j in sorted(picks[i])] for i, (worker, _) in enumerate(workers)}


def _improve(picks: list[set[int]], wants: list[list[bool]], n: int, lo: int) -> None:
    """Turn negative cycles of the residual graph (workers, nodes, a hub; worker -> node
    takes a place, -1 if wanted; node -> worker gives it back; node -> hub -> node moves
    one between a node at lo + 1 and one at lo) found by Bellman-Ford until none is left:
    min-cost flow optimality. Each turn adds a wanted place, so this ends."""
    m = len(picks)
    hub = m + n
    counts = [0] * n
    for picked in picks:
        for j in picked:
            counts[j] += 1
    edges = [
        [m + j, i, int(want)] if j in picks[i] else [i, m + j, -int(want)]
        for i, row in enumerate(wants)
        for j, want in enumerate(row)
    ]
    edges += [[m + j, hub, 0] if c == lo else [hub, m + j, 0] for j, c in enumerate(counts)]
    dist = [0] * (hub + 1)
    into: list[list[int] | None] = [None] * (hub + 1)
    changed = True
    while changed:
        changed = False
        for edge in edges:
            u, v, cost = edge
            if dist[u] + cost < dist[v]:
                dist[v] = dist[u] + cost
                into[v] = edge
                changed = True
        for cycle in _cycles(into):
            if sum(edge[2] for edge in cycle) >= 0:
                continue
            for edge in cycle:
                u, v, cost = edge
                if u < m <= v < hub:
                    picks[u].add(v - m)
                elif v < m <= u < hub:
                    picks[v].discard(u - m)
                edge[:] = [v, u, -cost]
                into[v] = None


def _cycles(into: list[list[int] | None]) -> list[list[list[int]]]:
    """The cycles (as edge lists) of the graph made of the edges ``into[v]`` (u, v, cost)."""
    state = [0] * len(into)  # 0: not seen, 1: on the current walk, 2: done
    found = []
    for start in range(len(into)):
        walk = []
        x: int | None = start
        while x is not None and not state[x]:
            state[x] = 1
            walk.append(x)
            edge = into[x]
            x = None if edge is None else edge[0]
        if x is not None and state[x] == 1:
            found.append([e for y in walk[walk.index(x) :] if (e := into[y]) is not None])
        for y in walk:
            state[y] = 2
    return found


def _place(
    worker: str,
    count: int,
    live: list[str],
    quota: dict[str, int],
    held: dict[str | None, list[int]],
) -> dict[ShardKey, str]:
    """Within ``quota``: holders keep their lowest shards; the rest by rendezvous hashing."""
    targets = {(worker, shard): n for n in live for shard in held.get(n, [])[: quota[n]]}
    free = [s for n, mine in held.items() for s in (mine if n is None else mine[quota[n] :])]
    room = {n: max(0, quota[n] - len(held.get(n, ()))) for n in live}
    ids = [node for node in live if room[node] > 0]
    keys = [node.encode("utf-8") for node in ids]
    crc32 = zlib.crc32
    for shard in sorted(free):
        # crc32(text, crc32(prefix)) is crc32(prefix + text): one call per node
        seed = crc32(f"{worker}:{shard}:".encode())
        scores = [(crc32(key, seed) * _SPREAD) & _MASK32 for key in keys]
        best = max(range(len(ids)), key=scores.__getitem__)  # ties: the lowest id
        node = ids[best]
        targets[(worker, shard)] = node
        room[node] -= 1
        if not room[node]:
            del ids[best], keys[best]
    return targets
