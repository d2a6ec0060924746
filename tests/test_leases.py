"""The leases on a clock the test moves: waits that end, extensions sent at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

import shardq
from shardq.broker.base import BatchResult, Message, SendEntry
from shardq.core.clock import ManualClock
from shardq.run.leases import Leases
from tests.clocks import ends_within

QUEUE = "q.fifo"


class Recording(shardq.MemoryBroker):
    """Notes each visibility change; its deletes wait until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.changes: list[tuple[str, float]] = []
        self.changed = threading.Event()
        self.answer = threading.Event()
        self.answer.set()

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        self.changes.extend(changes)
        self.changed.set()
        return super().change_visibility_batch(queue, changes)

    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        assert self.answer.wait(30)
        return super().delete_batch(queue, receipts)


@pytest.fixture
def broker() -> Iterator[Recording]:
    broker = Recording()
    broker.ensure_queue(QUEUE)
    yield broker
    broker.answer.set()
    broker.close()


def receive_one(broker: Recording, visibility_timeout: int) -> list[Message]:
    broker.send_batch(QUEUE, [SendEntry("0", "{}", "e", "d-0")])
    messages = broker.receive(
        QUEUE, max_messages=1, wait_seconds=0, visibility_timeout=visibility_timeout
    )
    assert len(messages) == 1
    return messages


def started(broker: Recording, clock: ManualClock, interval: float = 1.0) -> Leases:
    leases = Leases(broker, ThreadPoolExecutor(2), interval=interval, clock=clock)
    leases.start()
    return leases


def test_closing_on_a_clock_nobody_moves_sends_the_pending_delete_and_ends(
    broker: Recording,
) -> None:
    # given leases on a clock nobody moves, holding a job whose delete was asked for
    # (a settle lingers a while on that clock to fill a batch)
    leases = started(broker, ManualClock())
    messages = receive_one(broker, 30)
    leases.hold(messages, 30)
    leases.delete(messages)
    # when they are closed, then the delete is sent at once and confirmed
    assert ends_within(10, lambda: leases.close(5)) is True
    assert broker.counts(QUEUE).in_flight == 0 and leases.count() == 0


def test_closing_while_the_broker_does_not_answer_ends_after_its_timeout_in_real_time(
    broker: Recording,
) -> None:
    # given leases on a clock nobody moves, whose pending delete the broker does not answer
    broker.answer.clear()
    leases = started(broker, ManualClock())
    messages = receive_one(broker, 30)
    leases.hold(messages, 30)
    leases.delete(messages)
    # when they are closed with a timeout of 0.2 s, then closing ends, the job unsettled
    assert ends_within(10, lambda: leases.close(0.2)) is False
    assert leases.count() == 1


def test_waiting_for_a_release_on_a_clock_nobody_moves_ends_after_its_timeout(
    broker: Recording,
) -> None:
    # given leases on a clock nobody moves, holding a job nobody settles
    leases = started(broker, ManualClock())
    messages = receive_one(broker, 30)
    leases.hold(messages, 30)
    # when a caller waits 0.2 s for its release, then the wait ends, not released
    assert ends_within(10, lambda: leases.wait_released([messages[0].receipt], 0.2)) is False
    leases.close(1)


def test_an_extension_due_after_the_clock_moved_on_is_sent_at_once(broker: Recording) -> None:
    # given leases whose keeper looks for extensions every 10 s, holding a job received
    # with a 120 s visibility timeout (extended once less than 60 s remain)
    clock = ManualClock()
    leases = started(broker, clock, interval=10)
    messages = receive_one(broker, 120)
    leases.hold(messages, 120)
    assert not broker.changed.is_set()
    # when the clock moves 61 s on
    clock.advance(61)
    # then the extension goes out well before the keeper's next look of its own, by a
    # full timeout
    assert broker.changed.wait(1.0)
    assert broker.changes == [(messages[0].receipt, 120)]
    leases.close(1)
