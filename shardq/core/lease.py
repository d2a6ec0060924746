"""One held message's lease (:class:`shardq.run.leases.Leases` keeps them): its states,
whether its job may start, its extensions, what the broker's answers mean, and the order
held jobs are handed back in (:func:`hand_back`)."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

import structlog

from shardq.core.limits import MAX_VISIBILITY_SECONDS
from shardq.core.messages import Message

log = structlog.get_logger("shardq.leases")

HELD, DELETE, CHANGE = "held", "delete", "change"
#: A job is not started with less visibility left than this.
START_MARGIN_SECONDS = 0.25
#: Longest wait between tries of a failed request.
MAX_BACKOFF_SECONDS = 5.0


@dataclass(eq=False)
class Lease:
    """One held message."""

    message: Message
    visibility_timeout: float
    expires: float  # monotonic time at which the message becomes visible again
    state: str = HELD
    seconds: float = 0.0  # for CHANGE: visible again after this many seconds
    asked: float = 0.0  # monotonic time the settle was asked for
    not_before: float = 0.0  # backoff after a failed request
    tries: int = 0
    busy: bool = False  # a request about it is in flight
    lost: bool = False

    def lapsed(self, now: float) -> bool:
        """No longer this node's to run, or less than :data:`START_MARGIN_SECONDS` of
        visibility left (the local clock starts a little after the broker's)."""
        return self.lost or self.expires - START_MARGIN_SECONDS <= now

    def extension(self, wall: float) -> float | None:
        """Seconds to extend it by: a full timeout, within 12 h of the receive (Unix
        time ``wall``); None, and lost, past that."""
        room = self.message.received_at + MAX_VISIBILITY_SECONDS - wall - 1
        if room > 0:
            return min(self.visibility_timeout, room)
        self.lost = True
        log.warning(
            "lease.cap_reached",
            queue=self.message.queue,
            message_id=self.message.message_id,
            detail="12 h since the receive; the broker will deliver this job again",
        )
        return None

    def answered(
        self,
        seconds: float,
        extension: bool,
        sent: float,
        now: float,
        error: BaseException | None,
        refused: str | None,
    ) -> bool:
        """The broker answered a request about it (``error``: the request failed;
        ``refused``: why the broker refused this entry). True if it is settled."""
        self.busy = False
        m = self.message
        if extension:
            if error is None and refused is not None:
                log.warning("lease.lost", queue=m.queue, message_id=m.message_id, reason=refused)
                self.lost = True
            elif error is None:
                self.expires = sent + seconds  # counted from when it was sent
            return False  # a failed extension: the next round tries again
        if error is not None and self.expires > now:
            self.tries += 1
            self.not_before = now + min(MAX_BACKOFF_SECONDS, 0.2 * 2**self.tries)
            return False
        if error is not None or refused is not None:
            log.warning(
                "job.delete_failed" if self.state == DELETE else "lease.change_failed",
                queue=m.queue,
                entity=m.group_id,
                message_id=m.message_id,
                reason=refused or "the broker was unreachable until its visibility ran out",
                detail="the job ran but may be delivered again"
                if self.state == DELETE
                else "it becomes visible when its current visibility ends",
            )
        return True


def hand_back(
    held: Iterable[Message],
    running: Container[str] = (),
    retries: Iterable[tuple[float, list[Message]]] = (),
    now: float = 0.0,
) -> list[tuple[list[Message], float]]:
    """``(messages, seconds)`` to hide held jobs for, in the order to apply them: each
    held retry ``(due, messages)`` for the rest of its delay, the other held jobs of its
    entity as long, one by one, the rest at once, in order. Jobs whose receipt is in
    ``running`` are left alone (a running job keeps its entity's later ones)."""
    out: list[tuple[list[Message], float]] = []
    retry_due: dict[tuple[str, str], float] = {}
    for due, messages in sorted((r for r in retries if r[1]), key=lambda r: r[0]):
        out.append((messages, max(0.0, due - now)))
        retry_due[(messages[0].queue, messages[0].group_id)] = due
    retried = {m.receipt for messages, _ in out for m in messages}
    unstarted = sorted(
        (m for m in held if m.receipt not in running and m.receipt not in retried),
        key=lambda m: (m.queue, m.sequence),
    )
    behind = [m for m in unstarted if (m.queue, m.group_id) in retry_due]
    out += [([m], max(0.0, retry_due[m.queue, m.group_id] - now)) for m in behind]
    out.append(([m for m in unstarted if (m.queue, m.group_id) not in retry_due], 0.0))
    return [(messages, seconds) for messages, seconds in out if messages]
