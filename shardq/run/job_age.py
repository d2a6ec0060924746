"""``job.old``: a warning for a received job that has waited long in its queue.

SQS deletes a message older than its queue's retention period, run or not. A node warns
once per message whose age passes ``retention_warning_share`` of that period.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import structlog

from shardq.broker.base import Broker, Message
from shardq.core.clock import Clock, wall
from shardq.core.errors import BrokerError

log = structlog.get_logger("shardq.node")

#: Message ids remembered as already warned about (oldest forgotten first).
REMEMBERED = 10_000


def too_old(sent_at: float, now: float, retention: float | None, share: float) -> bool:
    """Is a job sent at ``sent_at`` older than ``share`` of its queue's ``retention`` at
    ``now`` (None: the queue keeps messages; a share of 0 turns the warning off)?"""
    if retention is None or share <= 0:
        return False
    return now - sent_at > share * retention


class OldJobs:
    """Warns (``job.old``) once per message about received jobs :func:`too_old`."""

    def __init__(self, broker: Broker, share: float, clock: Clock = wall) -> None:
        self.broker = broker
        self.share = share
        self.clock = clock
        self._warned: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, messages: Sequence[Message]) -> int:
        """Log ``job.old`` for each message newly found too old; returns how many."""
        if self.share <= 0 or not messages:
            return 0
        try:
            retention = self.broker.retention_seconds(messages[0].queue)
        except BrokerError:
            return 0  # the next receive asks again
        now = self.clock()
        warned = 0
        for message in messages:
            if not too_old(message.sent_at, now, retention, self.share):
                continue
            with self._lock:
                if message.message_id in self._warned:
                    continue
                self._warned[message.message_id] = None
                if len(self._warned) > REMEMBERED:
                    self._warned.popitem(last=False)
            warned += 1
            log.warning(
                "job.old",
                queue=message.queue,
                message_id=message.message_id,
                entity=message.group_id,
                age_seconds=round(now - message.sent_at, 1),
                retention_seconds=retention,
                hint="SQS deletes it unrun at its queue's retention: add nodes or fix the "
                "entity's failing job",
            )
        return warned
