"""A shard as its lane sees it, a batch by entity, and what reaches a lane's inbox."""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shardq.core.messages import Message
from shardq.core.plan import ShardRef


@dataclass(eq=False)
class Shard:
    """A shard as its lane sees it."""

    ref: ShardRef
    queue: str
    visibility_timeout: int
    batches: deque[list[Message]] = field(default_factory=deque)  # received, not started
    more: bool = False  # may have work: worth a receive
    fetching: int = 0  # receives in flight
    watched: bool = False  # idle: the idle watch has it
    head_sent_at: float | None = None  # sent time of the oldest job believed waiting
    last_served: int = 0
    dropped: bool = False  # no longer served: no receive or batch of it starts
    leave: Leave | None = None  # dropped, swept, waiting for its receives in flight
    sweeping: bool = False  # dropped: its slots still run or hand back its jobs


#: What reaches a lane's inbox: a shard and what a receive found (None: "may have
#: work", from the embedded watcher), and whether the receive came back full.
Found = tuple[Shard, "list[Message] | None", bool]
#: Reaches a lane's inbox when the slots have room again.
WAKE = "wake"


@dataclass(frozen=True)
class Join:
    """A shard for the lane to serve too (it starts in the idle watch)."""

    shard: Shard


@dataclass(frozen=True)
class Leave:
    """A shard to serve no more (already marked ``dropped``). ``swept`` is called in the
    lane's thread once its unstarted messages and held retries were handed back."""

    shard: Shard
    swept: Callable[[], None]


@dataclass(frozen=True)
class Swept:
    """The slots handed back every job of a dropped shard."""

    shard: Shard


#: A lane's inbox (the idle watch and the receives in flight put what they found there).
Inbox = queue.SimpleQueue[Found | Join | Leave | Swept | str]


def by_entity(messages: list[Message]) -> list[list[Message]]:
    """A batch's messages by entity, each entity's in receive order."""
    groups: dict[str, list[Message]] = {}
    for m in messages:
        groups.setdefault(m.group_id, []).append(m)
    return list(groups.values())
