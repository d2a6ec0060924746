"""A node's execution slots: many entities at once, each in order, bounded by
``concurrency``; back-pressure; a perform raising any BaseException is a failure."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq import morgue
from shardq.broker.base import Message
from shardq.core.clock import Clock, ManualClock, monotonic
from shardq.core.config import Config
from shardq.core.errors import ConfigError
from shardq.core.outcome import DONE, HIDDEN, LATER, EntityEnd
from shardq.core.plan import ShardRef
from shardq.run.chain import RUNNING, Chain, join, settle_again
from shardq.run.node import Node
from shardq.run.shard import Shard
from shardq.run.slots import Slots
from shardq.run.threads import Threads
from shardq.run.timing import (
    INLINE_BELOW_SECONDS,
    KNOWN_AFTER_JOBS,
    Timing,
    may_take,
    run_inline,
    timing_after,
)
from tests.clocks import ends_within
from tests.conftest import make_broker


# -- the decisions, on plain data -------------------------------------------------------
@pytest.mark.parametrize(
    ("waiting", "concurrency", "expected"),
    [(0, 1, True), (0, 4, True), (3, 4, True), (4, 4, False), (13, 4, False)],
)
def test_a_lane_takes_more_only_while_fewer_jobs_than_slots_wait(
    waiting: int, concurrency: int, expected: bool
) -> None:
    assert may_take(waiting, concurrency) is expected


QUICK = Timing(INLINE_BELOW_SECONDS / 10, KNOWN_AFTER_JOBS)


@pytest.mark.parametrize(
    ("timing", "busy", "expected"),
    [
        (None, 0, False),  # nothing known yet: a slot (it may wait long)
        (QUICK._replace(jobs=KNOWN_AFTER_JOBS - 1), 0, False),  # too few jobs measured
        (QUICK, 0, True),  # quick jobs, a free slot
        (QUICK, 3, True),
        (QUICK._replace(mean=INLINE_BELOW_SECONDS * 2), 0, False),  # slower jobs: a slot
        (QUICK, 4, False),  # every slot busy: wait for one
    ],
)
def test_quick_jobs_run_in_their_lane_only_while_a_slot_is_free(
    timing: Timing | None, busy: int, expected: bool
) -> None:
    assert run_inline(timing, busy, 4) is expected


def test_a_workers_mean_starts_at_its_first_run_and_moves_a_tenth_of_the_way() -> None:
    # given nothing measured yet, then a run of 10 jobs of 1 ms and one of 5 of 11 ms
    first = timing_after(None, 0.001, 10)
    # then the first run is the mean, the next moves it a tenth of the way to 11 ms,
    # and the jobs measured add up
    assert first == Timing(0.001, 10)
    second = timing_after(first, 0.011, 5)
    assert second.mean == pytest.approx(0.002) and second.jobs == 15


def test_concurrency_out_of_bounds_is_refused_with_its_name() -> None:
    with pytest.raises(ConfigError, match="concurrency: expected an integer from 1 to 1000"):
        Config(concurrency=0)
    with pytest.raises(ConfigError, match="concurrency"):
        Config.load(env={"SHARDQ_CONCURRENCY": "1001"})
    assert Config.load(env={"SHARDQ_CONCURRENCY": "64"}).concurrency == 64


# -- a node ---------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "sqlite-reopen", pytest.param("sqs", marks=pytest.mark.sqs)])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_app(kind: str, tmp_path: Path, request: pytest.FixtureRequest, **config: Any) -> Any:
    broker = make_broker(kind, tmp_path, request)
    prefix = f"s{time.monotonic_ns() % 10**9}-"
    app = shardq.App(
        Config(queue_prefix=prefix, grace_seconds=10, idle_wait_seconds=1, **config),
        broker=broker,
    )
    app.store.ensure_table()  # DynamoDB's, as `shardq queues ensure` makes it
    return app


class Watch:
    """What the workers count: running at once, per entity, in order."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.running = 0
        self.peak = 0
        self.entities: set[str] = set()
        self.overlaps = 0
        self.seen: dict[str, list[int]] = {}

    def enter(self, entity: str, n: int) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            if entity in self.entities:
                self.overlaps += 1
            self.entities.add(entity)
            self.seen.setdefault(entity, []).append(n)
            self.lock.notify_all()

    def leave(self, entity: str) -> None:
        with self.lock:
            self.running -= 1
            self.entities.discard(entity)


def morgue_records(app: shardq.App, worker: str) -> list[morgue.MorgueRecord]:
    """Every dead job of ``worker``, from the app's state store, in death order."""
    return morgue.Morgue(app, worker).list_jobs(limit=10_000)


def run_until_empty(node: Node, timeout: float = 90) -> int:
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(node.run()))
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), "the node did not drain in time"
    return codes[0]


def test_a_node_runs_up_to_concurrency_entities_at_once_each_in_order(
    broker_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a worker with 2 shards, 50 entities x 4 jobs, and a node with concurrency 10
    # whose first 10 jobs wait for each other (they can only all pass if 10 run at once)
    app = make_app(broker_kind, tmp_path, request, concurrency=10)
    watch, meet = Watch(), threading.Barrier(10, timeout=60)
    started = iter(range(10**6))

    @app.register
    class Io(shardq.Worker):
        shards = 2

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            watch.enter(entity_id, payloads[0])
            try:
                if next(started) < 10:
                    meet.wait()
                else:
                    time.sleep(0.002)
            finally:
                watch.leave(entity_id)

    Io.publish_many([(f"e{e}", n) for n in range(4) for e in range(50)])
    # when the node drains them with 2 threads
    node = app.node(app.plan(threads=2), until_empty=True, seed=3)
    code = run_until_empty(node)
    # then 10 jobs ran at once (never more), no entity ran twice at once, each in order
    assert code == 0 and not meet.broken
    assert watch.peak == 10 and node.slots.peak <= 10
    assert watch.overlaps == 0
    assert watch.seen == {f"e{e}": [0, 1, 2, 3] for e in range(50)}
    assert sum(node.tally().succeeded.values()) == 200


def test_a_node_holds_no_more_jobs_than_its_slots_can_start_soon(
    broker_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given 300 entities with one job each, every job blocked until released, and a
    # node with concurrency 4 and one thread (prefetch 2)
    app = make_app(broker_kind, tmp_path, request, concurrency=4)
    release, watch = threading.Event(), Watch()

    @app.register
    class Blocked(shardq.Worker):
        shards = 2

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            watch.enter(entity_id, payloads[0])
            try:
                release.wait(60)
            finally:
                watch.leave(entity_id)

    Blocked.publish_many([(f"e{e}", e) for e in range(300)])
    node = app.node(app.plan(threads=1), until_empty=True, seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    try:
        # when its 4 slots are busy, for a second of receives
        with watch.lock:
            assert watch.lock.wait_for(lambda: watch.running >= 4, 30)
        held = []
        for _ in range(50):
            held.append(node.leases.count())
            time.sleep(0.02)
    finally:
        release.set()
    runner.join(90)
    # then it ran 4 at once, and held at most the 4 running jobs, fewer than 4 + one
    # receive waiting for a slot, what its thread received ahead (3 receives) and one
    # receive of each shard's idle watch (a poller hands over one batch per watch; on
    # SQS both shards start watched, and a slow start lets both deliver)
    assert not runner.is_alive()
    assert watch.peak == 4
    assert max(held) <= 4 + (4 - 1 + 10) + 3 * 10 + 2 * 10 < 300
    # and every job ran once it could
    assert sum(node.tally().succeeded.values()) == 300


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_perform_raising_a_base_exception_is_a_failed_attempt_and_the_node_serves_on(
    error: type[BaseException], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a worker whose perform raises SystemExit (or another BaseException) for
    # entity "bad", one retry allowed, and other entities' jobs
    app = make_app("sqlite", tmp_path, request)
    runs: list[tuple[str, int]] = []

    @app.register
    class Exits(shardq.Worker):
        max_retries = 1

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            runs.append((entity_id, payloads[0]))
            if entity_id == "bad" and payloads[0] == 0:
                raise error("user code exited")

        def retry_in(self, attempt: int) -> float:
            return 0.0

    Exits.publish_many([("bad", 0), ("bad", 1), *[(f"ok{n}", n) for n in range(20)]])
    # when a node drains them
    node = app.node(app.plan(threads=1), until_empty=True)
    code = run_until_empty(node)
    # then the node stayed up and exited 0; the job ran twice, then went to the morgue,
    # and the entity's next job ran after it; every other job ran
    assert code == 0
    assert [r for r in runs if r[0] == "bad"] == [("bad", 0), ("bad", 0), ("bad", 1)]
    assert sum(1 for r in runs if r[0] != "bad") == 20
    tally = node.tally()
    assert tally.morgued == {"Exits": 1} and tally.retried == {"Exits": 1}
    (record,) = morgue_records(app, "Exits")
    assert (record.entity_id, record.error_type) == ("bad", error.__name__)


def test_shardq_run_warns_when_threads_exceed_the_shards_they_could_serve() -> None:
    from structlog.testing import capture_logs

    from shardq.ops import cli

    # given 8 threads for 2 shards, then 2 threads for 2 shards
    with capture_logs() as logs:
        cli._warn_idle_threads(8, 2)
        cli._warn_idle_threads(2, 2)
    # then only the first warns, naming both and what to set instead
    (warning,) = [e for e in logs if e["event"] == "node.idle_threads"]
    assert (warning["threads"], warning["shards"], warning["log_level"]) == (8, 2, "warning")
    assert "concurrency" in warning["detail"]


# -- entity chains, with a stand-in executor ---------------------------------------------
class Recorder:
    """Runs nothing: records each run of an entity's jobs, the first one held until
    ``go`` is set and ending ``first`` (a retry due ``delay`` after it started, on
    ``clock``), and what was given up, deleted or hidden."""

    def __init__(self, first: str = DONE, delay: float = 0.0, clock: Clock = monotonic) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.first, self.delay, self.clock = first, delay, clock
        self.ran = threading.Condition()
        self.runs: list[list[str]] = []
        self.given_up: list[list[str]] = []
        self.deleted: list[list[str]] = []
        self.hidden: list[tuple[list[str], float]] = []
        self.was_hidden = threading.Event()

    def run_entity(self, ref: Any, messages: list[Message], stop: Any = None) -> EntityEnd:
        with self.ran:
            self.runs.append([m.receipt for m in messages])
            self.ran.notify_all()
        due = self.clock() + self.delay
        self.started.set()
        assert self.go.wait(30)
        if self.first != DONE and len(self.runs) == 1:
            return EntityEnd(self.first, messages, due)
        return EntityEnd(DONE)

    def give_up_later(self, messages: list[Message]) -> None:
        self.given_up.append([m.receipt for m in messages])

    def delete(self, messages: list[Message]) -> None:
        self.deleted.append([m.receipt for m in messages])

    def hide(self, messages: list[Message], seconds: float) -> None:
        self.hidden.append(([m.receipt for m in messages], seconds))
        self.was_hidden.set()

    hide_later = hide

    def wait_runs(self, slots: Slots, count: int) -> None:
        """Wait until ``count`` runs started and the slots settled them (real time)."""
        with self.ran:
            assert self.ran.wait_for(lambda: len(self.runs) >= count, 30)
        assert slots.join(30) and slots.idle()


class Batches(Recorder):
    """Also runs a batch's entities in the calling thread (``run_entities``), noting
    the thread; entity ``late`` ends in a local retry due in an hour."""

    def __init__(self) -> None:
        super().__init__()
        self.go.set()
        self.threads: list[int] = []

    def run_entities(self, ref: Any, groups: list[list[Message]], stop: Any) -> Iterator[EntityEnd]:
        for messages in groups:
            self.runs.append([m.receipt for m in messages])
            self.threads.append(threading.get_ident())
            if messages[0].group_id == "late":
                yield EntityEnd(LATER, messages, self.clock() + 3600)
            else:
                yield EntityEnd(DONE)


def message(message_id: str, receipt: str, sequence: str) -> Message:
    return Message("q", message_id, receipt, "{}", "e", 1, 0.0, sequence)


def running_a_with_b_joined(recorder: Recorder) -> tuple[Slots, Shard]:
    """Slots running job A of entity e (receipt a-1), and job B of e (b-1) joined."""
    slots = Slots(4, recorder, threading.Event(), Threads())  # type: ignore[arg-type]
    shard = Shard(ShardRef("W", 0, 1), "q", 30)
    slots.hand(shard, [[message("a", "a-1", "1")]])
    assert recorder.started.wait(30)
    slots.hand(shard, [[message("b", "b-1", "2")]])
    return slots, shard


def test_a_job_delivered_again_while_it_waits_takes_its_first_copys_place() -> None:
    # given slots running job A of entity e, and job B of e waiting behind it
    recorder = Recorder()
    slots, shard = running_a_with_b_joined(recorder)
    # when B is received again (its first copy's visibility ran out), with job C after it
    slots.hand(shard, [[message("b", "b-2", "2"), message("c", "c-1", "3")]])
    recorder.go.set()
    recorder.wait_runs(slots, 2)
    # then B runs once, with its new receipt, in its place before C; its first copy is
    # given up (not run, not extended)
    assert recorder.runs == [["a-1"], ["b-2", "c-1"]]
    assert recorder.given_up == [["b-1"]]
    slots.close()


def job(entity: str, receipt: str) -> Message:
    return Message("q", receipt, receipt, "{}", entity, 1, 0.0, receipt)


def test_a_quick_workers_entities_run_in_the_lane_and_only_a_retry_gets_a_chain() -> None:
    # given slots whose first run of a worker (in a slot) found its jobs quick: one job,
    # then enough to know
    batches = Batches()
    slots = Slots(4, batches, threading.Event(), Threads())  # type: ignore[arg-type]
    shard = Shard(ShardRef("W", 0, 1), "q", 30)
    slots.hand(shard, [[job("one", "o-1")]])
    batches.wait_runs(slots, 1)
    slots.hand(shard, [[job("first", f"f-{n}") for n in range(KNOWN_AFTER_JOBS - 1)]])
    batches.wait_runs(slots, 2)
    assert len(batches.runs) == 2 and batches.threads == []  # both in slot threads
    # when a batch of two entities comes, one of them ending in a local retry
    slots.hand(shard, [[job("late", "l-1")], [job("quick", "q-1")]])
    # then both ran in the calling thread, and only the retry is held (in a chain)
    assert batches.threads == [threading.get_ident()] * 2
    assert [[m.receipt for m in ms] for _, ms in slots.retries()] == [["l-1"]]
    assert slots.in_use() == 0 and slots.running() == []
    # when the next batch brings a later job of each
    slots.hand(shard, [[job("late", "l-2")], [job("quick", "q-2")]])
    # then the held entity's job waits behind its retry, in order; the other runs here
    assert [[m.receipt for m in ms] for _, ms in slots.retries()] == [["l-1", "l-2"]]
    assert batches.runs[-1] == ["q-2"] and len(batches.threads) == 3
    slots.close()


def run_with_m_delivered_again(recorder: Recorder) -> None:
    """Slots run job M (receipt m-1); while it runs, M is received again (its first
    copy's visibility ran out, receipt m-2) with job N after it; then all settle."""
    slots = Slots(4, recorder, threading.Event(), Threads())  # type: ignore[arg-type]
    shard = Shard(ShardRef("W", 0, 1), "q", 30)
    slots.hand(shard, [[message("m", "m-1", "1")]])
    assert recorder.started.wait(30)
    slots.hand(shard, [[message("m", "m-2", "1"), message("n", "n-1", "2")]])
    recorder.go.set()
    recorder.wait_runs(slots, 2)
    slots.close()


def test_a_job_delivered_again_while_it_runs_runs_once_and_its_new_copy_is_deleted() -> None:
    # given slots running job M, when M is received again with job N after it
    recorder = Recorder()
    run_with_m_delivered_again(recorder)
    # then M runs once; once it succeeded its new copy is deleted with its own receipt
    assert recorder.runs == [["m-1"], ["n-1"]]
    assert recorder.deleted == [["m-2"]]
    assert recorder.given_up == []


def test_a_job_delivered_again_while_its_run_fails_is_retried_with_its_new_copy() -> None:
    # given slots running job M, whose run fails (a local retry), when M is received
    # again while it runs, with job N after it
    recorder = Recorder(first=LATER)
    run_with_m_delivered_again(recorder)
    # then the retry runs the new copy before N; the first copy is given up, none deleted
    assert recorder.runs == [["m-1"], ["m-2", "n-1"]]
    assert recorder.given_up == [["m-1"]]
    assert recorder.deleted == []


# -- dues on the executor's clock, which the slots read too --------------------------------
def test_a_handover_hides_a_held_retry_for_what_is_left_of_its_delay() -> None:
    # given slots whose run of entity e ends in a local retry due 2 s after it started,
    # on a clock the test moves, with job B of e joined while it ran
    clock = ManualClock()
    recorder = Recorder(first=LATER, delay=2.0, clock=clock)
    slots, shard = running_a_with_b_joined(recorder)
    recorder.go.set()
    # when half a second passes and the shard is handed over
    clock.advance(0.5)
    swept = threading.Event()
    slots.sweep(shard, [], swept.set)
    # then the retry and B behind it are hidden for the 1.5 s left, in order, not run here
    assert swept.wait(30)
    assert recorder.hidden == [(["a-1", "b-1"], 1.5)]
    assert recorder.runs == [["a-1"]] and slots.idle()
    slots.close()


class Counted:
    """A lock that records each time it is taken."""

    def __init__(self, lock: Any, taken: list[int]) -> None:
        self.lock, self.taken = lock, taken

    def __enter__(self) -> Any:
        self.taken.append(1)
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)


def test_a_handover_is_done_without_a_stuck_run_whose_entity_stays_held_until_it_ends() -> None:
    # given slots running job A of entity e (the run does not end), with job B of e
    # joined, on a clock the test moves
    clock = ManualClock()
    recorder = Recorder(clock=clock)
    slots, shard = running_a_with_b_joined(recorder)
    # when the shard is dropped and handed over, and the run goes on for the 30 s a
    # handover waits
    shard.dropped = True
    swept: list[bool] = []
    slots.sweep(shard, [], lambda: swept.append(True))
    clock.advance(29.9)
    slots.overdue()
    assert swept == []
    clock.advance(0.1)
    slots.overdue()
    # then the handover is done without it, and B, behind it, is still held here
    assert swept == [True]
    assert recorder.hidden == [] and recorder.runs == [["a-1"]]
    # and while A still runs, the lanes' later looks take no lock (they are many)
    taken, lock = [], slots._lock
    slots._lock = Counted(lock, taken)  # type: ignore[assignment]
    clock.advance(60)
    slots.overdue()
    slots._lock = lock
    assert taken == []
    # and once A ends, B is released here (not run), and the handover is not done twice
    recorder.go.set()
    assert recorder.was_hidden.wait(30)
    assert slots.join(30) and slots.idle()
    assert recorder.hidden == [(["b-1"], 0.0)] and recorder.runs == [["a-1"]]
    slots.overdue()
    assert swept == [True]
    slots.close()


def test_a_job_that_joined_a_run_hidden_for_a_retry_is_hidden_until_the_retry_is_due() -> None:
    # given slots whose run of entity e ends with its job hidden at the broker for a
    # retry due 60 s after the run started, on a clock the test moves, and job B of e
    # joined while it ran
    clock = ManualClock()
    recorder = Recorder(first=HIDDEN, delay=60.0, clock=clock)
    slots, _ = running_a_with_b_joined(recorder)
    # when the run ends 20 s later
    clock.advance(20)
    recorder.go.set()
    # then B is hidden for the 40 s left (it reappears behind the retry), not run here
    assert recorder.was_hidden.wait(30)
    assert recorder.hidden == [(["b-1"], 40.0)]
    assert recorder.runs == [["a-1"]] and slots.idle()
    slots.close()


def test_waiting_for_running_chains_on_a_clock_nobody_moves_ends_after_its_timeout() -> None:
    # given slots on a clock nobody moves, running a job that does not end yet
    recorder = Recorder(clock=ManualClock())
    slots, _ = running_a_with_b_joined(recorder)
    # when a caller waits 0.2 s for the running chains, then the wait ends, one running
    assert ends_within(10, lambda: slots.join(0.2)) is False
    # when the job ends, then the wait sees it
    recorder.go.set()
    assert ends_within(10, lambda: slots.join(30)) is True
    slots.close()


# -- copies delivered again, on plain data -------------------------------------------------
def running_chain(*receipts: str) -> Chain:
    chain = Chain(("q", "e"), Shard(ShardRef("W", 0, 1), "q", 30), [], RUNNING)
    chain.running = [message(r.split("-")[0], r, r.split("-")[0]) for r in receipts]
    return chain


def test_a_copy_of_a_job_that_ran_to_an_end_is_to_be_deleted() -> None:
    # given a chain running M and N, and M delivered again meanwhile
    chain = running_chain("m-1", "n-1")
    assert join(chain, [message("m", "m-2", "m")]) == []
    # when the run ends with both done
    end, ended, stale = settle_again(chain, EntityEnd(DONE))
    # then the new copy of M is to be deleted, nothing given up, nothing to run
    assert ([m.receipt for m in ended], stale, end.kind) == (["m-2"], [], DONE)
    assert chain.pending == [] and chain.again == {}


def test_a_copy_of_a_job_held_for_a_retry_takes_the_first_copys_place() -> None:
    # given a chain running M and N, M and N delivered again meanwhile
    chain = running_chain("m-1", "n-1")
    join(chain, [message("m", "m-2", "m"), message("n", "n-2", "n")])
    # when M succeeded and N failed, held for a local retry
    first = chain.running
    end, ended, stale = settle_again(chain, EntityEnd(LATER, [first[1]], 5.0))
    # then M's new copy is to be deleted, N's retry runs its new copy, the first is given up
    assert [m.receipt for m in ended] == ["m-2"]
    assert ([m.receipt for m in end.messages], end.due) == (["n-2"], 5.0)
    assert [m.receipt for m in stale] == ["n-1"]


def test_a_copy_of_a_job_hidden_for_a_retry_goes_first_among_the_jobs_to_hide() -> None:
    # given a chain running M, delivered again, and job P that joined after it
    chain = running_chain("m-1")
    join(chain, [message("m", "m-2", "m"), message("p", "p-1", "p")])
    # when M failed and was hidden at the broker
    end, ended, stale = settle_again(chain, EntityEnd(HIDDEN, list(chain.running), 60.0))
    # then the new copy goes before P, to be hidden with it; nothing deleted or given up
    assert [m.receipt for m in chain.pending] == ["m-2", "p-1"]
    assert (ended, stale, end.kind) == ([], [], HIDDEN)
