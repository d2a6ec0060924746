"""The broker contract: every broker gives the same SQS FIFO semantics.

Each test runs against the embedded SQLite broker, the in-memory broker and SQS
(a ministack emulator process).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.broker import Broker, Message, SendEntry, SendResult, base
from shardq.broker.sqs import SqsBroker
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.limits import BODY_REFUSED
from tests.conftest import BROKER_KINDS, make_broker


def send(broker: Broker, queue: str, group: str, *bodies: str) -> list[str]:
    entries = [SendEntry(str(i), b, group, uuid.uuid4().hex) for i, b in enumerate(bodies)]
    result = broker.send_batch(queue, entries)
    assert not result.failed
    return [result.message_ids[e.id] for e in entries]


def receive(
    broker: Broker, queue: str, n: int = 10, vt: float = 30, wait: float = 0
) -> list[Message]:
    return broker.receive(queue, max_messages=n, wait_seconds=wait, visibility_timeout=vt)


def bodies(messages: list[Message]) -> list[str]:
    return [m.body for m in messages]


def delete(broker: Broker, queue: str, messages: list[Message]) -> None:
    assert not broker.delete_batch(queue, [m.receipt for m in messages]).failed


@pytest.fixture(params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    instance = make_broker(request.param, tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def queue(broker: Broker, queue_name: str) -> str:
    broker.ensure_queue(queue_name, visibility_timeout=30)
    return queue_name


def test_messages_of_a_group_come_in_send_order(broker: Broker, queue: str) -> None:
    # given 25 messages of one group sent in three batches
    expected = [f"m{i}" for i in range(25)]
    for start in range(0, 25, 10):
        send(broker, queue, "g", *expected[start : start + 10])
    # when they are received and deleted one receive at a time
    seen: list[str] = []
    while batch := receive(broker, queue, n=3):
        seen += bodies(batch)
        delete(broker, queue, batch)
    # then they came in send order
    assert seen == expected


def test_a_group_is_blocked_while_one_of_its_messages_is_in_flight(
    broker: Broker, queue: str
) -> None:
    # given two messages in group a and one in group b
    send(broker, queue, "a", "a1", "a2")
    send(broker, queue, "b", "b1")
    # when a1 is received (and stays in flight)
    first = receive(broker, queue, n=1)
    assert bodies(first) == ["a1"]
    # then a2 is withheld while b1 is served
    assert bodies(receive(broker, queue)) == ["b1"]
    assert receive(broker, queue) == []
    # and a2 comes once a1 is deleted
    delete(broker, queue, first)
    assert bodies(receive(broker, queue)) == ["a2"]


def test_a_group_stays_blocked_until_every_message_in_flight_is_resolved(
    broker: Broker, queue: str
) -> None:
    # given four messages of a group, three of them received together
    send(broker, queue, "g", "1", "2", "3", "4")
    one, two, three = receive(broker, queue, n=3)
    # when the middle one is released and the first deleted
    assert not broker.change_visibility_batch(queue, [(two.receipt, 0)]).failed
    delete(broker, queue, [one])
    # then the group stays blocked while the third is in flight
    assert receive(broker, queue) == []
    # and once it is deleted the group goes on in order
    delete(broker, queue, [three])
    assert bodies(receive(broker, queue)) == ["2", "4"]


def test_a_long_group_goes_on_after_a_full_batch_is_deleted(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", *[f"m{i}" for i in range(10)])
    send(broker, queue, "g", "m10", "m11")
    first = receive(broker, queue, n=10)
    assert bodies(first) == [f"m{i}" for i in range(10)]
    delete(broker, queue, first)
    assert bodies(receive(broker, queue)) == ["m10", "m11"]


def test_one_receive_returns_several_messages_of_a_group_in_order(
    broker: Broker, queue: str
) -> None:
    send(broker, queue, "g", "1", "2", "3", "4")
    batch = receive(broker, queue, n=10)
    assert bodies(batch) == ["1", "2", "3", "4"]
    assert {m.group_id for m in batch} == {"g"}


def test_visibility_expiry_redelivers_the_whole_batch_in_order(broker: Broker, queue: str) -> None:
    # given five messages of one group received together with a 1 s visibility
    send(broker, queue, "g", *[f"m{i}" for i in range(5)])
    assert len(receive(broker, queue, vt=1)) == 5
    # when their visibility runs out together (a receive waits for that)
    again = receive(broker, queue, vt=30, wait=5)
    # then all five come back, in order, with a receive count of 2
    assert bodies(again) == [f"m{i}" for i in range(5)]
    assert [m.receive_count for m in again] == [2] * 5


def test_change_visibility_to_zero_releases_at_once(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "x", "y")
    batch = receive(broker, queue)
    result = broker.change_visibility_batch(queue, [(m.receipt, 0) for m in batch])
    assert not result.failed
    assert bodies(receive(broker, queue)) == ["x", "y"]


def test_change_visibility_to_n_seconds_hides_until_then(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "x")
    (message,) = receive(broker, queue, vt=30)
    changed = time.monotonic()
    assert not broker.change_visibility_batch(queue, [(message.receipt, 2)]).failed
    assert receive(broker, queue) == []
    # a receive waiting up to 5 s gets it once the 2 s are over, not before
    assert bodies(receive(broker, queue, wait=5)) == ["x"]
    assert time.monotonic() - changed >= 1.0  # SQS counts whole seconds, rounding down


def test_receive_count_counts_every_receive(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "x")
    counts = []
    for _ in range(3):
        (message,) = receive(broker, queue)
        counts.append(message.receive_count)
        broker.change_visibility_batch(queue, [(message.receipt, 0)])
    assert counts == [1, 2, 3]


def test_received_messages_carry_their_group_and_sent_time(broker: Broker, queue: str) -> None:
    before = time.time()
    (message_id,) = send(broker, queue, "order-42", "x")
    (message,) = receive(broker, queue)
    assert message.group_id == "order-42"
    assert message.message_id == message_id
    assert before - 2 <= message.sent_at <= time.time() + 2
    assert message.sequence


def test_dedup_id_within_the_window_drops_the_copy(broker: Broker, queue: str) -> None:
    first = broker.send_batch(queue, [SendEntry("1", "x", "g", "same")])
    second = broker.send_batch(queue, [SendEntry("1", "x-again", "g", "same")])
    assert not first.failed and not second.failed
    assert bodies(receive(broker, queue)) == ["x"]
    assert second.message_ids["1"] == first.message_ids["1"]


def test_dedup_id_is_remembered_after_delete(broker: Broker, queue: str) -> None:
    broker.send_batch(queue, [SendEntry("1", "x", "g", "idem-1")])
    delete(broker, queue, receive(broker, queue))
    broker.send_batch(queue, [SendEntry("1", "x", "g", "idem-1")])
    assert receive(broker, queue) == []


def test_a_bad_entry_fails_alone_in_a_send_batch(broker: Broker, queue: str) -> None:
    result = broker.send_batch(
        queue,
        [
            SendEntry("ok1", "a", "g", "d1"),
            SendEntry("bad", "b", "has space", "d2"),
            SendEntry("ok2", "c", "g", "d3"),
        ],
    )
    assert set(result.message_ids) == {"ok1", "ok2"}
    assert set(result.failed) == {"bad"}
    assert bodies(receive(broker, queue)) == ["a", "c"]


@pytest.mark.parametrize("body", ["", "a\x00b", "a\x1fb", "a\ufffeb", "a\ud800b"])
def test_a_body_sqs_refuses_fails_alone_in_a_send_batch(
    broker: Broker, queue: str, body: str
) -> None:
    # given an empty body, or one with a character outside SQS's set, between good ones
    entries = [SendEntry("ok1", "a\tb\U0001f600", "g", "d1"), SendEntry("bad", body, "g", "d2")]
    # when they are sent in one batch
    result = broker.send_batch(queue, [*entries, SendEntry("ok2", "c", "g", "d3")])
    # then that entry fails alone, on every broker
    assert set(result.failed) == {"bad"}
    assert bodies(receive(broker, queue)) == ["a\tb\U0001f600", "c"]


def test_a_printable_body_is_sent_without_searching_it_for_refused_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given the search for characters SQS refuses, recorded, and a printable body (as
    # shardq's encoder makes), one with a tab and one with U+FFFE
    searched: list[str] = []

    class Recording:
        def search(self, body: str) -> re.Match[str] | None:
            searched.append(body)
            return BODY_REFUSED.search(body)

    monkeypatch.setattr(base, "BODY_REFUSED", Recording())
    printable = '{"v": 1, "entity": "order-é", "payload": "ok 😀"}'
    entries = [SendEntry("p", printable, "g", "d1"), SendEntry("t", "a\tb", "g", "d2")]
    entries.append(SendEntry("x", "a\ufffeb", "g", "d3"))
    # when they are checked for a send, then the printable one was not searched (the
    # search costs about 1 us per short body, 5 ms per MiB), and only U+FFFE fails
    result = SendResult()
    assert [e.id for e in base.valid_entries(entries, lambda: 1 << 20, result)] == ["p", "t"]
    assert set(result.failed) == {"x"}
    assert searched == ["a\tb", "a\ufffeb"]


@given(st.text())
def test_a_printable_text_holds_no_character_sqs_refuses(text: str) -> None:
    assert not text.isprintable() or BODY_REFUSED.search(text) is None


def test_a_stale_receipt_fails_alone_in_a_delete_batch(broker: Broker, queue: str) -> None:
    # given x received once with a short visibility, then redelivered
    send(broker, queue, "g", "x")
    send(broker, queue, "h", "y")
    (stale,) = receive(broker, queue, n=1, vt=1)
    time.sleep(1.5)
    fresh = receive(broker, queue)
    assert sorted(bodies(fresh)) == ["x", "y"]
    # when the old receipt and a fresh one are deleted together
    result = broker.delete_batch(queue, [stale.receipt, fresh[1].receipt])
    # then the stale one fails and the fresh one is deleted
    assert set(result.failed) == {stale.receipt}


def test_a_visibility_change_with_a_bad_receipt_fails_alone(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "x")
    (message,) = receive(broker, queue)
    result = broker.change_visibility_batch(queue, [(message.receipt, 0), ("1.nonsense", 0)])
    assert set(result.failed) == {"1.nonsense"}
    assert bodies(receive(broker, queue)) == ["x"]


def test_message_size_is_limited_by_the_queue(broker: Broker, queue_name: str) -> None:
    broker.ensure_queue(queue_name, max_message_bytes=1024)
    assert broker.max_message_bytes(queue_name) == 1024
    result = broker.send_batch(
        queue_name,
        [SendEntry("fits", "x" * 1024, "g", "d1"), SendEntry("big", "x" * 1025, "g", "d2")],
    )
    assert set(result.failed) == {"big"}
    assert set(result.message_ids) == {"fits"}


def test_a_batch_over_ten_entries_is_refused(broker: Broker, queue: str) -> None:
    entries = [SendEntry(str(i), "x", "g", f"d{i}") for i in range(11)]
    with pytest.raises(BrokerError):
        broker.send_batch(queue, entries)
    assert receive(broker, queue) == []


def test_a_waiting_receive_wakes_when_a_message_is_sent(broker: Broker, queue: str) -> None:
    # given a receive waiting up to 10 s on an empty queue
    got: list[Message] = []
    waiter = threading.Thread(target=lambda: got.extend(receive(broker, queue, wait=10)))
    started = time.monotonic()
    waiter.start()
    # when a message is sent 0.3 s later
    time.sleep(0.3)
    send(broker, queue, "g", "wake")
    waiter.join(12)
    # then the receive returns it long before its wait ran out
    assert bodies(got) == ["wake"]
    assert time.monotonic() - started < 5


def test_a_waiting_receive_wakes_when_a_group_is_unblocked(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "first", "second")
    first = receive(broker, queue, n=1)
    got: list[Message] = []
    waiter = threading.Thread(target=lambda: got.extend(receive(broker, queue, wait=10)))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    delete(broker, queue, first)
    waiter.join(12)
    assert bodies(got) == ["second"]
    assert time.monotonic() - started < 5


def test_counts_report_waiting_and_in_flight(broker: Broker, queue: str) -> None:
    send(broker, queue, "a", "a1", "a2")
    send(broker, queue, "b", "b1")
    receive(broker, queue, n=1)
    counts = broker.counts(queue)
    assert (counts.waiting, counts.in_flight) == (2, 1)


def test_a_missing_queue_raises_queue_not_found(broker: Broker) -> None:
    with pytest.raises(QueueNotFoundError):
        broker.send_batch(f"missing-{uuid.uuid4().hex[:8]}.fifo", [SendEntry("1", "x", "g", "d")])


def test_ensure_queue_twice_keeps_the_messages(broker: Broker, queue: str) -> None:
    send(broker, queue, "g", "x")
    broker.ensure_queue(queue, visibility_timeout=30)
    assert bodies(receive(broker, queue)) == ["x"]


def test_queue_settings_report_what_the_queue_was_created_with(
    broker: Broker, queue_name: str
) -> None:
    assert broker.queue_settings(queue_name) is None
    broker.ensure_queue(queue_name, visibility_timeout=45, max_message_bytes=2048)
    settings = broker.queue_settings(queue_name)
    assert settings is not None
    assert (settings.fifo, settings.visibility_timeout, settings.max_message_bytes) == (
        True,
        45,
        2048,
    )
    assert settings.content_based_dedup is False


def test_counts_give_the_oldest_send_time_and_deletes_when_the_broker_knows(
    broker: Broker, queue: str
) -> None:
    # given two messages sent a moment apart, the first of which is deleted
    before = time.time()
    send(broker, queue, "a", "a1")
    time.sleep(0.05)
    send(broker, queue, "b", "b1")
    delete(broker, queue, receive(broker, queue, n=1))
    counts = broker.counts(queue)
    # then the oldest remaining message is b1, and one delete is counted
    # (SQS exposes neither: both are None there)
    if counts.oldest_sent_at is not None:
        assert before + 0.04 <= counts.oldest_sent_at <= time.time()
    if counts.deleted_total is not None:
        assert counts.deleted_total == 1
    assert broker.kind == "sqs" or counts.oldest_sent_at is not None


def test_a_deleted_queue_and_its_messages_are_gone(broker: Broker, queue: str) -> None:
    # given a queue holding a message, one of them in flight
    send(broker, queue, "g", "a", "b")
    assert bodies(receive(broker, queue, n=1)) == ["a"]
    # when it is deleted
    broker.delete_queue(queue)
    # then it is not there: counting, receiving and sending say so
    with pytest.raises(QueueNotFoundError):
        broker.counts(queue)
    with pytest.raises(QueueNotFoundError):
        send(broker, queue, "g", "c")
    # and deleting it again is a no-op
    broker.delete_queue(queue)


def test_a_send_to_a_queue_deleted_by_another_client_is_refused(
    broker: Broker, queue: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a client that sent to the queue (so it knows the queue), and the queue
    # deleted through another client of the same broker
    send(broker, queue, "g", "a")
    kind = request.node.callspec.params["broker"]
    if kind == "memory":
        pytest.skip("the memory broker is one process' own: there is no other client")
    other = make_broker(kind, tmp_path, request)
    try:
        other.delete_queue(queue)
    finally:
        other.close()
    # when the first client counts or sends again, then it is told the queue is gone:
    # nothing lands in a queue nobody serves
    with pytest.raises(QueueNotFoundError):
        broker.counts(queue)
    with pytest.raises(QueueNotFoundError):
        send(broker, queue, "g", "b")


@pytest.mark.sqs
def test_sqs_ensure_queue_of_an_existing_queue_sends_no_create_queue(
    request: pytest.FixtureRequest, tmp_path: Path, queue_name: str
) -> None:
    # given a queue created elsewhere (e.g. Terraform), and a process whose role may not
    # create queues (a publisher, or a node, as docs/deployment.md allows)
    make_broker("sqs", tmp_path, request).ensure_queue(queue_name)
    broker = make_broker("sqs", tmp_path, request)
    assert isinstance(broker, SqsBroker)
    # when it ensures the queue, as every publish and node start does
    broker.ensure_queue(queue_name)
    # then it only looked the queue up: a CreateQueue would be denied by such a role
    assert broker.requests["CreateQueue"] == 0
    assert broker.requests["GetQueueUrl"] == 1
    # and a missing queue is still created
    broker.ensure_queue(other := f"t-{uuid.uuid4().hex[:16]}.fifo")
    assert broker.queue_settings(other) is not None


@pytest.mark.sqs
def test_sqs_queue_settings_then_ensure_queue_of_a_missing_queue_looks_it_up_once(
    request: pytest.FixtureRequest, tmp_path: Path, queue_name: str
) -> None:
    # given a process about to create a queue that does not exist (`queues ensure`)
    broker = make_broker("sqs", tmp_path, request)
    assert isinstance(broker, SqsBroker)
    # when it reads the queue's settings (none: missing) and then ensures it
    assert broker.queue_settings(queue_name) is None
    broker.ensure_queue(queue_name)
    # then it looked the queue up once and created it: no second lookup after the miss
    assert broker.requests["GetQueueUrl"] == 1 and broker.requests["CreateQueue"] == 1
    assert broker.queue_settings(queue_name) is not None


def test_sqs_a_failed_queue_lookup_says_it_was_looking_the_queue_up() -> None:
    # given an SQS endpoint where nothing listens (port 9, discard)
    broker = SqsBroker(region="us-east-1", endpoint_url="http://127.0.0.1:9")
    # when a queue is ensured, then the error names the lookup (no CreateQueue was sent)
    with pytest.raises(BrokerError, match=r"^looking up queue q\.fifo"):
        broker.ensure_queue("q.fifo")
    assert broker.requests["CreateQueue"] == 0
