"""An entity chain: one entity's jobs held by a node, in order, while they run, wait
for a slot, a local retry or a release; and copies of its jobs delivered again meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardq.core.messages import Message
from shardq.core.outcome import GAVE_UP, HIDDEN, EntityEnd

if TYPE_CHECKING:
    from shardq.run.shard import Shard

READY = "ready"  # waiting for a slot
RUNNING = "running"  # in a slot
DEFERRED = "deferred"  # held for a local retry, due at ``due``
PARKED = "parked"  # not started at a stop or a handover: released by the sweep
GONE = "gone"  # no longer the entity's chain

Key = tuple[str, str]


@dataclass(eq=False, slots=True)
class Chain:
    """One entity's jobs held by the node, in order."""

    key: Key
    shard: Shard
    pending: list[Message]  # not started, in order
    state: str
    running: list[Message] = field(default_factory=list)  # handed to the executor now
    #: Copies of running jobs delivered again: settled once the run ends.
    again: dict[str, Message] = field(default_factory=dict)
    due: float = 0.0


def join(chain: Chain, messages: list[Message]) -> list[Message]:
    """Later jobs join the end of the chain. A copy delivered again takes its waiting
    first copy's place, or waits for its running first copy's end (:func:`settle_again`).
    Returns the first copies replaced (to give up)."""
    waiting = {m.message_id: i for i, m in enumerate(chain.pending)}
    running = {m.message_id for m in chain.running}
    stale = []
    for m in messages:
        i = waiting.get(m.message_id)
        if m.message_id in running:
            older = chain.again.get(m.message_id)
            if older is not None:
                stale.append(older)
            chain.again[m.message_id] = m
        elif i is None:
            chain.pending.append(m)
        else:
            stale.append(chain.pending[i])
            chain.pending[i] = m
    return stale


def settle_again(chain: Chain, end: EntityEnd) -> tuple[EntityEnd, list[Message], list[Message]]:
    """A run ended: copies of its jobs delivered again meanwhile follow their first copy.
    Returns the end to act on, the new copies of jobs that ended (to delete) and the
    first copies they replace in a retry or a stop (to give up). After a hidden retry or
    a lapse, the new copies go first in ``chain.pending``."""
    if not chain.again:
        return end, [], []
    again, chain.again = chain.again, {}
    left = {m.message_id for m in end.messages}
    ended = [m for key, m in again.items() if key not in left]
    if end.kind in (HIDDEN, GAVE_UP):  # the first copies are settled: hidden, given up
        fresh = [again[m.message_id] for m in end.messages if m.message_id in again]
        chain.pending = [*fresh, *chain.pending]
        return end, ended, []
    stale = [m for m in end.messages if m.message_id in again]
    moved = [again.get(m.message_id, m) for m in end.messages]
    return EntityEnd(end.kind, moved, end.due), ended, stale
