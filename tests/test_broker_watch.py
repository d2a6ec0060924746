"""``Broker.watch``: waiting on many queues at once (contract, every broker).

The embedded brokers watch; SQS cannot and returns None (the node long-polls each
queue with ``receive`` there).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardq.broker import Broker, SendEntry, SqliteBroker
from tests.conftest import make_broker
from tests.test_broker_contract import bodies, delete, receive, send


@pytest.fixture(params=["sqlite", "memory"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """The brokers that watch (SQS is asked only whether it can, below)."""
    instance = make_broker(request.param, tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def queues(broker: Broker) -> list[str]:
    names = [f"w{i}-{uuid.uuid4().hex[:12]}.fifo" for i in range(3)]
    for name in names:
        broker.ensure_queue(name, visibility_timeout=30)
    return names


def later(seconds: float, action: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()  # type: ignore[operator]

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("broker", [pytest.param("sqs", marks=pytest.mark.sqs)], indirect=True)
def test_sqs_cannot_watch_and_says_so_at_once(broker: Broker, queues: list[str]) -> None:
    started = time.monotonic()
    result = broker.watch(queues, 5)
    assert result is None
    assert time.monotonic() - started < 1


def test_a_watch_with_nothing_happening_times_out_empty(broker: Broker, queues: list[str]) -> None:
    started = time.monotonic()
    assert broker.watch(queues, 0.3) == []
    assert time.monotonic() - started >= 0.29


def test_a_queue_with_a_receivable_message_is_returned_at_once(
    broker: Broker, queues: list[str]
) -> None:
    send(broker, queues[1], "g", "x")
    started = time.monotonic()
    assert broker.watch(queues, 10) == [queues[1]]
    assert time.monotonic() - started < 5


def test_a_send_to_one_watched_queue_wakes_the_watch_with_that_queue(
    broker: Broker, queues: list[str]
) -> None:
    # given a watch over three empty queues
    sender = later(0.3, lambda: send(broker, queues[2], "g", "x"))
    started = time.monotonic()
    # when a message is sent to the third one
    result = broker.watch(queues, 10)
    sender.join()
    # then the watch returns that queue long before its timeout
    assert result == [queues[2]]
    assert time.monotonic() - started < 5


def test_a_queue_whose_messages_are_all_blocked_is_not_returned(
    broker: Broker, queues: list[str]
) -> None:
    # given a queue whose only visible message is behind an in-flight one of its group
    send(broker, queues[0], "g", "first", "second")
    assert bodies(receive(broker, queues[0], n=1, vt=30)) == ["first"]
    # when it is watched
    # then it is not reported (a watch loop would spin on it)
    assert broker.watch(queues, 0.5) == []


def test_a_blocked_group_whose_visibility_ends_wakes_the_watch(
    broker: Broker, queues: list[str]
) -> None:
    # given a group blocked by a message hidden for 1 s
    send(broker, queues[0], "g", "first", "second")
    receive(broker, queues[0], n=1, vt=1)
    started = time.monotonic()
    # when the queue is watched for 10 s
    result = broker.watch(queues, 10)
    # then the watch returns it when the visibility ends
    assert result == [queues[0]]
    assert 0.5 < time.monotonic() - started < 5


def test_a_delete_that_unblocks_a_group_wakes_the_watch(broker: Broker, queues: list[str]) -> None:
    send(broker, queues[1], "g", "first", "second")
    first = receive(broker, queues[1], n=1)
    deleter = later(0.3, lambda: delete(broker, queues[1], first))
    started = time.monotonic()
    result = broker.watch(queues, 10)
    deleter.join()
    assert result == [queues[1]]
    assert time.monotonic() - started < 5


def test_wake_waiters_ends_a_watch_at_once_and_empty(broker: Broker, queues: list[str]) -> None:
    waker = later(0.3, broker.wake_waiters)
    started = time.monotonic()
    assert broker.watch(queues, 10) == []
    waker.join()
    assert time.monotonic() - started < 5


def test_close_ends_a_watch_at_once(tmp_path: Path) -> None:
    broker = SqliteBroker(str(tmp_path / "b.db"))
    broker.ensure_queue("q.fifo")
    closer = later(0.3, broker.close)
    started = time.monotonic()
    assert broker.watch(["q.fifo"], 10) == []
    closer.join()
    assert time.monotonic() - started < 5


def test_a_watch_notices_a_send_by_another_process_on_the_same_file(tmp_path: Path) -> None:
    # given a broker watching a queue, and another connection to the same file
    # (as another node process would have)
    path = str(tmp_path / "b.db")
    watcher, other = SqliteBroker(path), SqliteBroker(path)
    watcher.ensure_queue("q.fifo")
    # when the other one sends
    sender = later(
        0.3, lambda: other.send_batch("q.fifo", [SendEntry("0", "x", "g", uuid.uuid4().hex)])
    )
    started = time.monotonic()
    result = watcher.watch(["q.fifo"], 10)
    sender.join()
    # then the watch returns the queue
    assert result == ["q.fifo"]
    assert time.monotonic() - started < 5
    watcher.close()
    other.close()


def test_a_waiting_receive_is_woken_only_by_writes_to_its_own_queue(tmp_path: Path) -> None:
    # given a receive waiting on queue a
    broker = SqliteBroker(str(tmp_path / "b.db"))
    for name in ("a.fifo", "b.fifo"):
        broker.ensure_queue(name)
    waiting = broker._waiters.add(["a.fifo"])
    # when queue b is written
    broker.send_batch("b.fifo", [SendEntry("0", "x", "g", "d")])
    # then the waiter of a was not woken; a write to a wakes it
    assert not waiting.is_set()
    broker.send_batch("a.fifo", [SendEntry("0", "x", "g", "d")])
    assert waiting.is_set()
    broker._waiters.remove(waiting)
    broker.close()
