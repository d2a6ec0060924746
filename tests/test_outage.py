"""The broker goes away mid-run: nodes back off, recover by themselves, lose nothing.

The SQS emulator (ministack) keeps its state across a restart when started with
``PERSIST_STATE=1``: it saves queues, messages, receipts and dedup ids when stopped
with SIGTERM and loads them when started again. Stopping it for 10 s and starting it
on the same port is therefore an outage of a service that keeps its data, as SQS
does, not a new empty SQS.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.plan import ShardRef
from shardq.core.topology import shard_for
from shardq.ops.ensure import ensure_state_table
from shardq.run.executor import Executor
from shardq.run.intake import Intake, OldJobs
from shardq.run.leases import Leases
from shardq.run.shard import Shard
from shardq.run.timelimit import TimeLimits
from tests import chaos
from tests import emulator as emu
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker

# -- a job whose visibility ran out before it started -------------------------------


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[shardq.App]:
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    ledger.reset()
    broker = make_broker(request.param, tmp_path, request)
    ledger.app.configure(Config(queue_prefix=f"o{time.monotonic_ns() % 10**9}-"), broker=broker)
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield ledger.app
    broker.close()


def test_a_job_whose_visibility_ran_out_before_it_started_is_not_run(
    app: shardq.App, tmp_path: Path
) -> None:
    # given a node that received two jobs of an entity with a 1 s visibility timeout,
    # and whose leases could not extend them (the broker was away: not started) ...
    Ledgered.publish_many([("e", {"n": 0}), ("e", {"n": 1})])
    queue = app.shard_queue("Ledgered", shard_for("e", 3))
    stale = app.broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=1)
    leases = Leases(app.broker, ThreadPoolExecutor(1))
    leases.hold(stale, 1)
    time.sleep(1.2)
    # ... so that another node received them once they became visible again
    other = app.broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    assert [m.message_id for m in other] == [m.message_id for m in stale]
    # when the first node gets round to running its batch
    executor = Executor(app, leases, TimeLimits(), threading.Event())
    with capture_logs() as logs:
        executor.run_batch(ShardRef("Ledgered", shard_for("e", 3), 1), stale)
    # then it runs neither job, says why, and no longer holds them
    assert not (tmp_path / "ledger.jsonl").exists()
    assert [e["event"] for e in logs] == ["job.lapsed", "job.lapsed"]
    assert leases.count() == 0
    # and the other node still owns them: its deletes succeed
    assert app.broker.delete_batch(queue, [m.receipt for m in other]).failed == {}


def test_a_message_whose_extension_the_broker_refused_is_lapsed(app: shardq.App) -> None:
    # given a held message that is due for an extension
    Ledgered.publish("e", {"n": 0})
    queue = app.shard_queue("Ledgered", shard_for("e", 3))
    (message,) = app.broker.receive(queue, max_messages=1, wait_seconds=0, visibility_timeout=30)
    leases = Leases(app.broker, ThreadPoolExecutor(1), interval=0.1)
    leases.hold([message], 30)
    assert not leases.lapsed(message)
    # when the broker refuses the extension (another consumer deleted the message)
    app.broker.delete_batch(queue, [message.receipt])
    with capture_logs() as logs:
        leases.hold([message], 0.5)  # due at once
        leases.start()
        deadline = time.monotonic() + 5
        while not any(e["event"] == "lease.lost" for e in logs) and time.monotonic() < deadline:
            time.sleep(0.02)
    # then the message is lapsed (before its visibility ends) until the node forgets it
    assert leases.lapsed(message)
    leases.forget([message])
    assert not leases.lapsed(message)
    leases.close(1)


# -- the emulator stopped for 10 s mid-run ------------------------------------------------


@pytest.fixture
def restartable_emulator(tmp_path: Path) -> Iterator[emu.Emulator]:
    """A ministack of this test alone that keeps its state in tmp_path across restarts."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    server = emu.start(state_dir=str(tmp_path / "ministack-state"))
    try:
        yield server
    finally:
        emu.stop(server)  # the pid is that of the latest start
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
@pytest.mark.sqs
def test_nodes_ride_out_a_broker_outage_and_lose_nothing(
    restartable_emulator: emu.Emulator, tmp_path: Path
) -> None:
    server = restartable_emulator
    state_dir = str(tmp_path / "ministack-state")

    def stop() -> None:
        emu.stop(server, timeout=30)  # SIGTERM: ministack saves its state first

    def start() -> None:
        server.pid = emu.start(port=server.port, state_dir=state_dir).pid

    # given 3 node processes working through 1,000 numbered jobs on the emulator
    settings = chaos.Settings(
        entities=100,
        duration=18.0,
        kill_every=None,
        sleep=0.02,
        outage_at=5.0,
        outage_seconds=10.0,
        publish_share=0.9,
        visibility_timeout=5,  # a stalled node on a loaded machine keeps its jobs
    )
    env = {
        "SHARDQ_BROKER_URL": "sqs://",
        "SHARDQ_ENDPOINT_URL": server.endpoint_url,
        "SHARDQ_REGION": "us-east-1",
        "SHARDQ_QUEUE_PREFIX": f"o{time.monotonic_ns() % 10**9}-",
    }
    try:
        # when the emulator is stopped 5 s in and started again 10 s later, same port
        report = chaos.run(settings, env, tmp_path / "chaos", chaos.Outage(stop, start))
    finally:
        ledger.app.broker.close()
    print(report.summary())
    # then the outage happened while jobs flowed, and the nodes logged failed calls
    assert report.outage is not None
    assert report.published == settings.entities * settings.jobs
    assert report.broker_trouble > 0
    # and, with no node restarted by hand, they drained every queue: nothing lost,
    # reordered or run twice at once; a job ran twice only if it first ran around
    # the outage (its delete did not reach the broker); every node stopped cleanly
    assert report.ok, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent


# -- an embedded broker that can read but not write -------------------------------------
class _ReadOnly(shardq.MemoryBroker):
    """Watches queues, but its receives fail (a read-only or full file) while ``broken``;
    ``busy`` is set at the 6th failed receive."""

    def __init__(self) -> None:
        super().__init__()
        self.broken, self.busy = threading.Event(), threading.Event()
        self.failed = 0

    def receive(self, queue: str, **kwargs: Any) -> list[shardq.broker.Message]:
        if self.broken.is_set():
            self.failed += 1
            if self.failed >= 6:
                self.busy.set()
            raise shardq.BrokerError("the embedded broker file b.db is read-only")
        return super().receive(queue, **kwargs)


def test_receives_an_embedded_broker_refuses_back_off_and_recover() -> None:
    # given a node on a clock the test moves, one job waiting, and a broker whose file
    # can be read (the idle watch sees the job) but not written (receives fail)
    clock, broker = ManualClock(), _ReadOnly()
    app = shardq.App(Config(queue_prefix="ro-", grace_seconds=1), broker=broker)
    done: list[str] = []

    @app.register
    class Writes(shardq.Worker):
        shards = 1

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            done.append(entity_id)

    broker.broken.set()
    Writes.publish("e", {})
    node = app.node(app.plan(threads=1), clock=clock)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        runner.start()
        # when the node runs, and a second more once a receive failed, while the clock
        # stands still
        deadline = time.monotonic() + 10
        while not broker.failed and time.monotonic() < deadline:
            time.sleep(0.02)
        busy = broker.busy.wait(1.0)
        failed = broker.failed
        # and the file is writable again, and the clock moves past the backoff
        broker.broken.clear()
        clock.advance(1.0)
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            time.sleep(0.02)
        node.stop()
        runner.join(30)
    # then it tried again only after its backoff, not in a busy loop, and then ran the job
    assert not busy, f"{failed} receives failed within a second"
    assert 1 <= failed <= 2
    assert done == ["e"]
    assert sum(e["event"] == "node.receive_failed" for e in logs) == failed


def _intake(broker: _ReadOnly, clock: ManualClock) -> Intake:
    """A node's intake on the embedded broker (one file for every queue)."""
    leases = Leases(broker, ThreadPoolExecutor(1), clock=clock)
    return Intake(
        broker,
        leases,
        OldJobs(broker, 0.0),
        ThreadPoolExecutor(1),
        fail=lambda what, exc: None,
        broker_error=lambda operation: None,
        clock=clock,
        one_file=True,
    )


def _shard(broker: _ReadOnly, name: str) -> Shard:
    broker.ensure_queue(name)
    return Shard(ShardRef(name, 0, 1), name, 30)


def _fail_for_a_minute(intake: Intake, clock: ManualClock, *shards: Shard) -> None:
    """Receives of ``shards`` fail each time their backoff ends, for a minute."""
    started = clock()
    while clock() < started + 60:
        for shard in shards:
            assert intake.receive(shard, 0) is None
        while any(intake.backing_off(shard.queue) for shard in shards):
            clock.advance(0.5)


def test_one_successful_receive_on_the_embedded_broker_ends_every_queues_backoff() -> None:
    # given two queues of one file whose receives failed for a minute, the second's last
    # failure 10 s after the first's (each backing off 30 s)
    clock, broker = ManualClock(), _ReadOnly()
    intake = _intake(broker, clock)
    first, second = _shard(broker, "a.fifo"), _shard(broker, "b.fifo")
    broker.broken.set()
    _fail_for_a_minute(intake, clock, first, second)
    assert intake.receive(first, 0) is None
    clock.advance(10.0)
    assert intake.receive(second, 0) is None
    # when the file is writable again and the first queue's receive succeeds after its
    # backoff, while the second's still runs
    broker.broken.clear()
    clock.advance(20.0)
    assert not intake.backing_off("a.fifo") and intake.backing_off("b.fifo")
    assert intake.receive(first, 0) == []
    # then the second queue backs off no more either: the file works
    assert not intake.backing_off("b.fifo")


def test_a_receive_failure_long_after_the_last_backs_off_from_the_first_step() -> None:
    # given a queue whose receives failed for a minute (backing off 30 s), never received
    # from since
    clock, broker = ManualClock(), _ReadOnly()
    intake = _intake(broker, clock)
    shard = _shard(broker, "a.fifo")
    broker.broken.set()
    _fail_for_a_minute(intake, clock, shard)
    assert intake.receive(shard, 0) is None
    clock.advance(29.0)
    assert intake.backing_off("a.fifo")
    # when one receive fails an hour later
    clock.advance(3600.0)
    assert intake.receive(shard, 0) is None
    # then it backs off 0.5 s, as after a first failure, not 30 s
    assert intake.backing_off("a.fifo")
    clock.advance(0.5)
    assert not intake.backing_off("a.fifo")


class _SlowToFail(_ReadOnly):
    """Its receives fail after 30 s on ``clock`` (the embedded broker's lock timeout)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock

    def receive(self, queue: str, **kwargs: Any) -> list[shardq.broker.Message]:
        if self.broken.is_set():
            self.clock.advance(30.0)
        return super().receive(queue, **kwargs)


def test_receives_that_fail_slowly_back_off_doubling() -> None:
    # given a queue whose receives fail each after 30 s (a locked file)
    clock = ManualClock()
    broker = _SlowToFail(clock)
    intake = _intake(broker, clock)
    shard = _shard(broker, "a.fifo")
    broker.broken.set()
    # when three receives fail, each tried as soon as the last one's backoff ended
    for _ in range(3):
        while intake.backing_off("a.fifo"):
            clock.advance(0.25)
        assert intake.receive(shard, 0) is None
    # then the backoff doubled: the third waits 2 s, not 0.5 s as after a first failure
    clock.advance(1.5)
    assert intake.backing_off("a.fifo")
    clock.advance(0.5)
    assert not intake.backing_off("a.fifo")


def test_a_queues_own_failure_on_the_embedded_broker_outlasts_another_queues_receive() -> None:
    # given two queues of one file, the second deleted: its receive failed, its own failure
    clock, broker = ManualClock(), _ReadOnly()
    intake = _intake(broker, clock)
    first, second = _shard(broker, "a.fifo"), _shard(broker, "b.fifo")
    broker.delete_queue("b.fifo")
    with capture_logs():
        assert intake.receive(second, 0) is None
    # when the first queue's receive succeeds
    assert intake.receive(first, 0) == []
    # then the second still backs off: the file works, but its queue is missing
    assert intake.backing_off("b.fifo")
    clock.advance(0.5)
    assert not intake.backing_off("b.fifo")
