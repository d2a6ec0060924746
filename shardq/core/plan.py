"""The plan: which node and which thread own each shard, dealt round-robin (a pure
function; docs/design/core.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardq.core.errors import ConfigError
from shardq.core.topology import parse_name, shard_key, shard_name


@dataclass(frozen=True)
class ShardRef:
    """One shard: a worker's queue number ``shard`` of layout generation ``gen``."""

    worker: str
    shard: int
    priority: int
    gen: int = 0

    @property
    def name(self) -> str:
        """The worker with its generation, as in shard keys: ``Orders``, ``Orders@2``."""
        return shard_name(self.worker, self.gen)

    @property
    def key(self) -> str:
        """The shard key of the fleet's ownership items: ``Orders:3``, ``Orders@2:3``."""
        return shard_key(self.worker, self.shard, self.gen)

    def __str__(self) -> str:
        return f"{self.name}[{self.shard}]"


@dataclass(frozen=True)
class Plan:
    """Shards per thread of one node: ``threads[t]`` lists the shards thread ``t`` owns."""

    node: int
    nodes: int
    threads: tuple[tuple[ShardRef, ...], ...]

    @property
    def shards(self) -> list[ShardRef]:
        return [ref for refs in self.threads for ref in refs]


def all_shards(workers: Mapping[str, tuple[int, int]]) -> list[ShardRef]:
    """Every shard, ordered by worker name then shard; ``workers`` maps a worker name
    (``Orders@2``: generation 2 of ``Orders``) to ``(shards, priority)``."""
    refs = []
    for name in sorted(workers):
        worker, gen = parse_name(name)  # "Orders@2": generation 2 of a resharded worker
        count, priority = workers[name]
        refs += [ShardRef(worker, shard, priority, gen) for shard in range(count)]
    return refs


def make_plan(
    workers: Mapping[str, tuple[int, int]], *, node: int, nodes: int, threads: int
) -> Plan:
    """The plan of node ``node`` of ``nodes`` with ``threads`` threads (at most one per
    shard of the node)."""
    if not workers:
        raise ConfigError("no workers are registered; check --app (default: the workers module)")
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {nodes}")
    if not 0 <= node < nodes:
        raise ConfigError(
            f"--node must be from 0 to {nodes - 1} (there are {nodes} nodes), got {node}"
        )
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    mine = all_shards(workers)[node::nodes]
    used = min(threads, len(mine))
    return Plan(node, nodes, tuple(tuple(mine[t::used]) for t in range(used)))


def format_plan(plans: list[Plan]) -> str:
    """A readable table of one or more node plans."""
    lines = []
    for plan in plans:
        lines.append(f"node {plan.node} of {plan.nodes}: {len(plan.shards)} shards")
        if not plan.threads:
            lines.append("  (no shards: more nodes than shards)")
        for t, refs in enumerate(plan.threads):
            lines.append(f"  thread {t}: " + ", ".join(str(r) for r in refs))
    return "\n".join(lines)
