"""What a stopping node hands back, on plain data; receiving while a node stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.broker.base import Message
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.lease import hand_back
from shardq.core.plan import ShardRef
from shardq.run.intake import Intake, OldJobs
from shardq.run.leases import Leases
from shardq.run.shard import Shard
from tests.clocks import ends_within


def message(receipt: str, entity: str, sequence: str) -> Message:
    return Message("q", receipt, receipt, "{}", entity, 1, 0.0, sequence)


def test_a_stopping_node_hides_retries_then_what_is_behind_them_then_releases_the_rest() -> None:
    # given a held retry of entity a due in 4 s, a's later job b2, job c1 of entity c
    # not started, and job r1 of entity r still running with its later job r2
    a1, a2 = message("a1", "a", "1"), message("a2", "a", "3")
    c1, r1, r2 = message("c1", "c", "2"), message("r1", "r", "4"), message("r2", "r", "5")
    held = [r2, c1, a2, a1, r1]
    # when the node hands back what it holds, at time 10
    out = hand_back(held, {"r1", "r2"}, [(14.0, [a1])], now=10.0)
    # then the retry is hidden first for what is left of its delay, a's later job as
    # long, c's job released at once; nothing of the running entity is touched
    assert [([m.receipt for m in ms], s) for ms, s in out] == [
        (["a1"], 4.0),
        (["a2"], 4.0),
        (["c1"], 0.0),
    ]


def test_a_handover_hides_retries_earliest_due_first_then_releases_the_rest_together() -> None:
    # given held retries of entity a (due at 12) and of entity b (due at 9, past), and
    # jobs d3 and c2 of entities d and c not started
    a1, b1 = message("a1", "a", "1"), message("b1", "b", "4")
    c2, d3 = message("c2", "c", "2"), message("d3", "d", "3")
    # when a shard's jobs are handed back at time 10 (nothing of them runs)
    out = hand_back([d3, c2], retries=[(12.0, [a1]), (9.0, [b1])], now=10.0)
    # then b's retry is released at once, a's hidden for the 2 s left, then c's and d's
    # jobs are released in one step, in order
    assert [([m.receipt for m in ms], s) for ms, s in out] == [
        (["b1"], 0.0),
        (["a1"], 2.0),
        (["c2", "d3"], 0.0),
    ]


def test_handing_back_gives_no_empty_step() -> None:
    # given a held retry of entity a due at 12 and nothing else held
    a1 = message("a1", "a", "1")
    # when it is handed back at time 10, and when nothing is
    out = hand_back([a1], retries=[(12.0, [a1])], now=10.0)
    nothing = hand_back([])
    # then the retry alone is hidden, for the 2 s left, and nothing gives no step
    assert [([m.receipt for m in ms], s) for ms, s in out] == [(["a1"], 2.0)]
    assert nothing == []


# -- receiving while a node stops ------------------------------------------------------------
class LongPolls(shardq.MemoryBroker):
    """Cannot watch queues, so a node long-polls each idle shard (as on SQS); a long poll
    waits until ``answer`` is set, whatever happens meanwhile (a stop cannot cut it short)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()
        self.polling = threading.Event()
        self.receives = 0

    def watch(self, queues: Sequence[str], timeout: float) -> list[str] | None:
        return None

    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        self.receives += 1
        if wait_seconds > 0:
            self.polling.set()
            assert self.answer.wait(30)
        return super().receive(
            queue, max_messages=max_messages, wait_seconds=0, visibility_timeout=visibility_timeout
        )


@pytest.fixture
def app() -> Iterator[shardq.App]:
    app = shardq.App(
        Config(queue_prefix="s-", grace_seconds=1, idle_wait_seconds=20), broker=LongPolls()
    )

    @app.register
    class Runs(shardq.Worker):
        shards = 1

        def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
            raise AssertionError("no job runs here")

    app.store.ensure_table()
    app.ensure_queues()
    yield app
    assert isinstance(app.broker, LongPolls)
    app.broker.answer.set()
    app.broker.close()


def intake(broker: LongPolls) -> Intake:
    leases = Leases(broker, ThreadPoolExecutor(1), clock=ManualClock())
    return Intake(
        broker,
        leases,
        OldJobs(broker, 0.0),
        ThreadPoolExecutor(1),
        fail=lambda what, exc: None,
        broker_error=lambda operation: None,
        clock=ManualClock(),
    )


def test_a_stopping_node_starts_no_receive(app: shardq.App) -> None:
    # given a node's intake that was stopped
    assert isinstance(app.broker, LongPolls)
    node_intake = intake(app.broker)
    node_intake.stop()
    # when a lane or poller asks for a receive, then none starts
    shard = Shard(ShardRef("Runs", 0, 1), app.shard_queue("Runs", 0), 30)
    assert node_intake.receive(shard, wait_seconds=20) is None
    assert app.broker.receives == 0


def test_waiting_for_receives_in_flight_on_a_clock_nobody_moves_ends_after_its_timeout(
    app: shardq.App,
) -> None:
    # given an intake on a clock nobody moves, with a long poll in flight
    assert isinstance(app.broker, LongPolls)
    node_intake = intake(app.broker)
    shard = Shard(ShardRef("Runs", 0, 1), app.shard_queue("Runs", 0), 30)
    poll = threading.Thread(target=node_intake.receive, args=(shard, 20))
    poll.start()
    assert app.broker.polling.wait(10)
    # when the stopping node waits 0.2 s for it, then the wait ends, the poll in flight
    assert ends_within(10, lambda: node_intake.quiet({shard.queue}, 0.2)) is False
    app.broker.answer.set()
    poll.join(10)


def test_a_poller_left_in_a_long_poll_is_reported_and_releases_what_it_brings(
    app: shardq.App,
) -> None:
    # given a node whose idle shard's poller is in a long poll
    broker = app.broker
    assert isinstance(broker, LongPolls)
    node = app.node(app.plan(threads=1), seed=1)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        runner.start()
        assert broker.polling.wait(10)
        # when a job arrives during the poll and the node stops
        app.workers["Runs"].publish("e", {})
        node.stop()
        runner.join(30)
        # then run() returned, and the log names the poller it left
        assert not runner.is_alive()
        (left,) = [e["threads"] for e in logs if e["event"] == "node.threads_left"]
        assert left == [f"shardq-poll-{ref}" for ref in node.plan.shards]
        pollers = [t for t in threading.enumerate() if t.name in left]
        assert pollers
    # when its long poll answers with the job
    broker.answer.set()
    # then the poller ends, and the job is visible again, not run
    for poller in pollers:
        poller.join(10)
        assert not poller.is_alive()
    counts = broker.counts(app.shard_queue("Runs", 0))
    assert (counts.waiting, counts.in_flight) == (1, 0)
