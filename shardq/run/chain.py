"""An entity chain: one entity's jobs held by a node, in order, while they run, wait
for a slot, wait for a local retry or wait to be released (:mod:`shardq.run.slots`), and
what becomes of copies of its jobs delivered again meanwhile (a copy's visibility ran
out while the node still held it).
"""

from __future__ import annotations

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


class Chain:
    """One entity's jobs held by the node, in order."""

    __slots__ = ("again", "due", "key", "pending", "running", "shard", "state")

    def __init__(self, key: Key, shard: Shard, pending: list[Message], state: str) -> None:
        self.key = key
        self.shard = shard
        self.pending = pending  # not started, in order
        self.running: list[Message] = []  # handed to the executor now
        #: Copies of running jobs delivered again: settled once the run ends.
        self.again: dict[str, Message] = {}
        self.state = state
        self.due = 0.0


def join(chain: Chain, messages: list[Message]) -> list[Message]:
    """Later jobs join the end of the chain (order holds). A job delivered again while
    its first copy still waits takes the first copy's place, with its new receipt;
    one delivered again while its first copy runs waits for that run's end
    (:func:`settle_again`). Returns the first copies replaced (to give up)."""
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
    """A run ended: copies of its jobs delivered again meanwhile follow their first
    copy. Returns the end to act on, the new copies of jobs that ran to an end (to
    delete: the first receipt may be stale) and the first copies they replace in a
    retry or a stop (``end.messages``: to give up). After a retry hidden at the broker
    or a lapse, the new copies go first in ``chain.pending``, to follow the others."""
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
