"""Which shard a thread serves next: a pure strategy over a snapshot (docs/design/core.md)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class ShardView(Generic[K]):
    """What the scheduler knows of a shard at one moment."""

    key: K
    priority: int
    #: Seconds the oldest job known to wait in this shard has waited (0 if unknown).
    lag: float
    #: True when the shard is known to have work; False when it is known to be empty.
    ready: bool
    #: Pick counter of the last time this shard was served (lower = longer ago).
    last_served: int = 0


class Scheduler:
    """Lottery over priority levels, then the laggiest shard of the winning level."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick_level(self, levels: Sequence[int]) -> int:
        """Draw one of ``levels`` (distinct priorities) with tickets = priority."""
        if len(levels) == 1:
            return levels[0]
        draw = self._rng.random() * sum(levels)
        for level in levels:
            draw -= level
            if draw < 0:
                return level
        return levels[-1]

    def pick(self, shards: Sequence[ShardView[K]]) -> ShardView[K] | None:
        """The shard to serve next, or None when no shard is known to have work."""
        levels: dict[int, list[ShardView[K]]] = {}
        for view in shards:
            if view.ready:
                levels.setdefault(view.priority, []).append(view)
        if not levels:
            return None
        level = self.pick_level(sorted(levels))
        return max(levels[level], key=lambda v: (v.lag, -v.last_served))
