"""Resharding inside a process: where publishers send, what a node's executor does with
a job of a moved entity (wait, run or relay), when a node switches and closes (on its own
clock, given here: no sleeps), and what ``shardq reshard`` and a changed class refuse."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.broker import Broker, Message, QueueCounts, SendEntry
from shardq.broker.base import release_now
from shardq.core import envelope
from shardq.core import layout as rules
from shardq.core.config import Config
from shardq.core.errors import BrokerError, LayoutError, QueueNotFoundError
from shardq.core.plan import ShardRef
from shardq.core.topology import shard_for
from shardq.morgue import Morgue
from shardq.ops import reshard
from shardq.ops.cli import main
from shardq.ops.ensure import ensure_state_table
from shardq.run.executor import Executor
from shardq.run.leases import Leases
from shardq.run.timelimit import TimeLimits
from shardq.store import Item, MemoryStore, StoreError
from tests.children import ROOT
from tests.clocks import Skipping
from tests.conftest import make_broker

app = shardq.App()
performed: list[tuple[str, list[Any]]] = []


@app.register
class Moved(shardq.Worker):
    shards = 2

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        performed.append((entity_id, list(payloads)))


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def moved(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[shardq.App]:
    broker = make_broker(request.param, tmp_path, request)
    prefix = f"r{time.monotonic_ns() % 10**9}-"
    app.configure(Config(queue_prefix=prefix, layout_refresh_seconds=0.1), broker=broker)
    performed.clear()
    app.layouts.clock = time.monotonic
    ensure_state_table(app)  # DynamoDB's table on ministack (the embedded file has its own)
    yield app
    broker.close()


def begin(app: shardq.App, shards: int) -> rules.WorkerLayout:
    """A reshard of Moved announced now (as ``shardq reshard`` does)."""
    app.ensure_queues()
    return reshard.start(app, "Moved", shards, by="test")


def switched(app: shardq.App, shards: int) -> rules.WorkerLayout:
    """A reshard of Moved announced and switched."""
    layout = begin(app, shards)
    return app.layouts.update("Moved", lambda w: rules.switch(w, layout.gen))


def take(broker: Broker, queue: str) -> list[Message]:
    return broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)


def executor(app: shardq.App) -> tuple[Executor, Leases]:
    leases = Leases(app.broker, ThreadPoolExecutor(2), interval=0.2)
    leases.start()
    return Executor(app, leases, TimeLimits(), threading.Event()), leases


def entity_in(old_shard: int, shards: int) -> str:
    return next(f"e{i}" for i in range(1000) if shard_for(f"e{i}", shards) == old_shard)


def test_publishers_keep_the_old_layout_while_announced_and_switch_with_the_item(
    moved: shardq.App,
) -> None:
    # given a reshard of Moved from 2 to 5 shards announced, and a publisher on a clock
    # the test moves
    clock = Skipping()
    moved.layouts.clock = clock
    layout = begin(moved, 5)
    # when a job is published, then it goes to the old layout
    Moved.publish("order-7", {"n": 1})
    old = moved.shard_queue("Moved", shard_for("order-7", 2), 0)
    assert [m.group_id for m in take(moved.broker, old)] == ["order-7"]
    # when the switch is written and the publisher reads again (its copy is 0.1 s old)
    moved.layouts.update("Moved", lambda w: rules.switch(w, layout.gen))
    clock.offset += 0.15
    Moved.publish("order-7", {"n": 2})
    # then the job is in the entity's shard of generation 1
    queue = moved.shard_queue("Moved", shard_for("order-7", 5), layout.gen)
    assert [m.group_id for m in take(moved.broker, queue)] == ["order-7"]


def test_the_command_writes_the_switch_once_trust_passed_on_its_own_clock(
    moved: shardq.App,
) -> None:
    # given a reshard announced by this process, trust 60 s (the default)
    clock = Skipping()
    moved.layouts.clock = clock
    begin(moved, 4)
    # when it looks before the trust window passed, then it is still announced
    clock.offset = 59.0
    assert reshard.progress(moved, "Moved").layout.state == "announced"
    # when it looks after, then it wrote the switch
    clock.offset = 61.0
    p = reshard.progress(moved, "Moved")
    assert p.layout.state == "switched"
    # and its line says the old shards are open, and that no node serves them
    line = reshard.describe(p)
    assert "switched; 2 of 2 old shards still open; 0 jobs still in the old layout" in line
    assert line.endswith(
        "STUCK: no node serves the old shards (is any node running? shardq "
        "nodes): the reshard does not progress until one does"
    )


def test_a_moved_entity_waits_while_its_old_shard_is_open_then_runs(moved: shardq.App) -> None:
    # given a reshard switched, and a job of an entity published to the new layout
    layout = switched(moved, 4)
    entity = entity_in(0, 2)
    Moved.publish(entity, {"n": 1})
    ref = ShardRef("Moved", shard_for(entity, 4), 1, layout.gen)
    queue = moved.shard_queue("Moved", ref.shard, ref.gen)
    run, leases = executor(moved)
    messages = take(moved.broker, queue)
    leases.hold(messages, 30)
    # when the executor gets it while the entity's old shard is open
    deferred = run.run_batch(ref, messages)
    # then it does not run: it is held, in order, to be looked at again
    assert performed == []
    assert [m.message_id for d in deferred for m in d.messages] == [messages[0].message_id]
    assert leases.count() == 1
    # when the old shard closes, then the held job runs
    moved.layouts.update("Moved", lambda w: rules.close(w, 0, 0))
    assert run.run_batch(ref, messages) == []
    assert performed == [(entity, [{"n": 1}])]
    leases.close(5)


def test_jobs_reaching_a_closed_old_shard_are_relayed_in_order(moved: shardq.App) -> None:
    # given a closed old shard holding two late jobs of an entity (a publisher that
    # began with the old layout), and the entity already has a job in the new layout
    entity = entity_in(0, 2)
    moved.ensure_queues()
    old = moved.shard_queue("Moved", 0, 0)
    Moved.publish(entity, {"n": 2})  # still the old layout: generation 0
    Moved.publish(entity, {"n": 3})
    layout = switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(w, 0, 0))
    new = moved.shard_queue("Moved", shard_for(entity, 3), layout.gen)
    Moved.publish(entity, {"n": 1})
    # when the node gets the old shard's jobs
    run, leases = executor(moved)
    messages = take(moved.broker, old)
    leases.hold(messages, 30)
    assert run.run_batch(ShardRef("Moved", 0, 1, 0), messages) == []
    assert leases.flush(5)
    # then they did not run there: they are in the new layout, after the entity's job
    assert performed == []
    assert take(moved.broker, old) == []
    relayed = take(moved.broker, new)
    assert [_n(m) for m in relayed] == [1, 2, 3]
    leases.close(5)


def stored_by_older_shardq(
    app: shardq.App, queue: str, entity: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job as an older shardq's embedded broker stored it: U+FFFE raw in its body."""
    doc = {"v": 1, "worker": "Moved", "entity": entity, "payload": {"n": "a\ufffeb"}, "meta": {}}
    body = json.dumps({**doc, "published_at": time.time()}, ensure_ascii=False)
    accept_all = lambda entries, max_bytes, result: list(entries)  # noqa: E731
    monkeypatch.setattr("shardq.broker.sqlite.valid_entries", accept_all)
    app.broker.send_batch(queue, [SendEntry("0", body, entity, "d0")])
    monkeypatch.undo()


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # SQS never stored such a body
def test_a_late_job_the_new_queue_refuses_for_good_goes_to_the_morgue_and_its_entity_moves_on(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a closed old shard holding a job an older shardq's embedded broker stored with
    # U+FFFE in its body (SQS refuses it; shardq's broker does since), then a later job
    entity = entity_in(0, 2)
    moved.ensure_queues()
    old = moved.shard_queue("Moved", 0, 0)
    stored_by_older_shardq(moved, old, entity, monkeypatch)
    Moved.publish(entity, {"n": 2})
    layout = switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(w, 0, 0))
    # when the node gets the old shard's jobs
    run, leases = executor(moved)
    messages = take(moved.broker, old)
    leases.hold(messages, 30)
    assert run.run_batch(ShardRef("Moved", 0, 1, 0), messages) == []
    assert leases.flush(5)
    # then the refused job is in the morgue as invalid, saying why, and the later one
    # is relayed: the old queue is empty, nothing ran there
    (dead,) = Morgue(moved, "Moved").list_jobs()
    assert (dead.reason, dead.message_id) == ("invalid_message", messages[0].message_id)
    assert dead.error_message == (
        "not relayed to the current layout, refused for good: SQS refuses the character "
        "'\\ufffe' in a body"
    )
    assert take(moved.broker, old) == [] and performed == []
    new = moved.shard_queue("Moved", shard_for(entity, 3), layout.gen)
    assert [_n(m) for m in take(moved.broker, new)] == [2]
    leases.close(5)


def test_a_publisher_whose_queue_was_deleted_publishes_to_the_live_layout(
    moved: shardq.App,
) -> None:
    # given a publisher whose copy says generation 0, and a reshard whose old queues
    # are gone (written by another process: a second app on the same store)
    moved.ensure_queues()
    Moved.publish("order-1", {"n": 0})
    other = shardq.App(moved.config, broker=moved.broker, store=moved.store)
    other.register(type("Moved", (shardq.Worker,), {"shards": 2, "perform": _perform}))
    layout = reshard.start(other, "Moved", 3)
    other.layouts.update("Moved", lambda w: rules.switch(w, layout.gen))
    for shard in range(2):
        other.layouts.update("Moved", lambda w, s=shard: rules.close(w, 0, s))
        moved.broker.delete_queue(moved.shard_queue("Moved", shard, 0))
    assert moved.layouts.cached("Moved").gen == 0
    # when it publishes, then the job lands in the live layout, nothing is refused
    report = moved.publisher.publish_many("Moved", [("order-1", {"n": 1})])
    assert report.sent == 1
    queue = moved.shard_queue("Moved", shard_for("order-1", 3), layout.gen)
    assert [m.group_id for m in take(moved.broker, queue)] == ["order-1"]


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    performed.append((entity_id, list(payloads)))


def test_a_class_whose_shards_changed_without_a_reshard_is_refused(moved: shardq.App) -> None:
    # given Moved recorded with 2 shards by a first publisher
    Moved.publish("order-1", {"n": 0})
    # when another app with the same prefix and store says 5 shards
    other = shardq.App(moved.config, broker=moved.broker, store=moved.store)
    other.register(type("Moved", (shardq.Worker,), {"shards": 5, "perform": _perform}))
    # then its publish and its node are refused, naming shardq reshard
    with pytest.raises(LayoutError, match=r"shardq reshard Moved --shards 5"):
        other.publisher.publish_many("Moved", [("order-1", {"n": 1})])

    node = other.node(other.plan(threads=1), seed=1)
    with pytest.raises(LayoutError, match="recorded with 2 shards"):
        node.run()
    # and no queue of the 5-shard layout was made
    for shard in range(2, 5):
        with pytest.raises(QueueNotFoundError):
            take(moved.broker, moved.shard_queue("Moved", shard, 0))


def test_a_changed_class_can_run_the_reshard_its_refusal_names(
    moved: shardq.App,
) -> None:
    # given Moved recorded with 2 shards, and an app whose code says 5 (refused above)
    Moved.publish("order-1", {"n": 0})
    other = shardq.App(moved.config, broker=moved.broker, store=moved.store)
    other.register(type("Moved", (shardq.Worker,), {"shards": 5, "perform": _perform}))
    # when that app runs the reshard the refusal names, then it is announced
    layout = reshard.start(other, "Moved", 5, by="test")
    assert (layout.moving is not None, layout.moving.shards, layout.shards) == (True, 2, 5)
    # and the app publishes again (to the old layout until the switch)
    other.publisher.publish_many("Moved", [("order-1", {"n": 1})])
    old = moved.shard_queue("Moved", shard_for("order-1", 2), 0)
    assert [_n(m) for m in take(moved.broker, old)] == [0, 1]


def test_shardq_run_until_empty_with_a_changed_class_fails_and_says_why(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"

    def run(shards: int) -> subprocess.CompletedProcess[str]:
        code = (
            "import sys; from shardq.ops.cli import main; "
            "from tests import test_reshard_core as t; "
            f"t.Moved.shards = {shards}; "
            f"sys.exit(main(['run', '--until-empty', '--app', 'tests.test_reshard_core', "
            f"'--broker-url', {url!r}]))"
        )
        return subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
        )

    # given Moved recorded with 2 shards by a first `shardq run`
    assert run(2).returncode == 0
    # when the class says 3 and `shardq run --until-empty` runs, then it fails, naming
    # shardq reshard (instead of exiting 0 with jobs left in the shards it dropped)
    done = run(3)
    assert done.returncode != 0
    assert "shardq reshard Moved --shards 3" in done.stderr


class Flaky(MemoryStore):
    """A store whose reads fail while ``down`` is set."""

    down = False

    def get(self, key: str) -> Item | None:
        if self.down:
            raise StoreError("the store is down (test)")
        return super().get(key)


def test_a_publisher_that_cannot_read_a_fresh_layout_refuses_after_the_trust_window(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a publisher that read Moved's layout, then lost its store
    store = Flaky()
    clock = Skipping()
    broker = make_broker("sqlite", tmp_path, request)
    config = Config(queue_prefix="flaky-", layout_refresh_seconds=1, reshard_trust_seconds=60)
    with app.override(config, broker=broker):
        app._store = store
        app.layouts.clock = clock
        Moved.publish("order-1", {"n": 0})
        store.down = True
        # when it publishes within the trust window, then its copy is used
        clock.offset = 30.0
        Moved.publish("order-1", {"n": 1})
        # when it publishes past it, then it refuses, saying why and what to check
        clock.offset = 61.0
        with pytest.raises(LayoutError, match=r"layout of Moved .* Check the store"):
            Moved.publish("order-1", {"n": 2})
        # and once the store is back it publishes again
        store.down = False
        Moved.publish("order-1", {"n": 3})
        queue = app.shard_queue("Moved", shard_for("order-1", 2), 0)
    app.layouts.clock = time.monotonic
    sent = []
    while batch := take(broker, queue):
        sent += [_n(m) for m in batch]
        broker.delete_batch(queue, [m.receipt for m in batch])
    broker.close()
    assert sent == [0, 1, 3]


class Slow(Flaky):
    """A store whose reads answer ``delay`` seconds (on ``clock``) after they were asked."""

    def __init__(self, clock: Skipping, delay: float) -> None:
        super().__init__()
        self.clock, self.delay = clock, delay

    def get(self, key: str) -> Item | None:
        item = super().get(key)
        self.clock.offset += self.delay
        return item


def test_a_copy_is_trusted_from_when_its_read_was_asked_not_answered(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a publisher whose store answered its read of Moved's layout 10 s after it
    # was asked (the item may have changed right after it was read), then went down
    clock = Skipping()
    store = Slow(clock, delay=10.0)
    broker = make_broker("sqlite", tmp_path, request)
    config = Config(queue_prefix="slow-", layout_refresh_seconds=1, reshard_trust_seconds=60)
    with app.override(config, broker=broker):
        app._store = store
        app.layouts.clock = clock
        Moved.publish("order-1", {"n": 0})
        store.down = True
        # when it publishes 61 s after the read was asked (51 s after its answer), then
        # it refuses: the copy may predate a switch written 60 s after an announce
        clock.offset = 61.0
        with pytest.raises(LayoutError, match=r"layout of Moved .* Check the store"):
            Moved.publish("order-1", {"n": 1})
    app.layouts.clock = time.monotonic
    broker.close()


def test_a_second_reshard_while_one_runs_is_refused(moved: shardq.App) -> None:
    # given a reshard under way
    begin(moved, 4)
    # when another is asked for, then it is refused, naming the one running
    with pytest.raises(LayoutError, match="from 2 to 4 shards is in progress"):
        reshard.start(moved, "Moved", 8)
    # and the item still shows the first one
    assert moved.layouts.read("Moved").shards == 4


def test_the_reshard_command_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'q.db'}"
    base = ["--app", "tests.test_reshard_core", "--broker-url", url]
    # an unknown worker, an out-of-range count, the same count: exit 2 and why
    assert main(["reshard", "Nope", "--shards", "4", *base]) == 2
    assert "no worker named 'Nope'" in capsys.readouterr().err
    assert main(["reshard", "Moved", "--shards", "0", *base]) == 2
    assert "--shards must be an int from 1 to 1000" in capsys.readouterr().err
    assert main(["reshard", "Moved", "--shards", "2", *base]) == 2
    assert "already has 2 shards" in capsys.readouterr().err
    # and a good one is announced (no node runs: --no-wait returns)
    assert main(["reshard", "Moved", "--shards", "3", "--no-wait", *base]) == 0
    assert "reshard from 2 to 3 shards announced" in capsys.readouterr().out


def test_ctrl_c_while_following_exits_130_saying_the_reshard_goes_on(tmp_path: Path) -> None:
    # given `shardq reshard` following a move that no node advances
    url = f"sqlite:///{tmp_path / 'q.db'}"
    args = ["reshard", "Moved", "--shards", "3", "--app", "tests.test_reshard_core"]
    child = subprocess.Popen(
        [sys.executable, "-m", "shardq", *args, "--broker-url", url],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert "announced" in child.stdout.readline()
    assert "following it" in child.stdout.readline()
    # when it gets Ctrl-C, then it exits 130 (not 0: the move has not ended), saying so
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert "stopped following; the reshard goes on" in stderr
    assert "Traceback" not in stderr


def _n(message: Message) -> int:
    return int(envelope.decode(message.body).payload["n"])


@app.register
class Sticky(shardq.Worker):
    """Jobs with ``stuck`` fail and retry in 30 s (hidden at the broker meanwhile)."""

    shards = 2
    max_retries = 100

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        performed.append((entity_id, list(payloads)))
        if any(p.get("stuck") for p in payloads):
            raise RuntimeError("stuck")

    def retry_in(self, attempt: int) -> float:
        return 30.0


def wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def driven(app: shardq.App) -> tuple[Any, Any]:
    """A static node of ``app`` and its layout keeper, set up as ``start()`` does, for a
    test to drive the keeper's ticks itself."""
    node = app.node(app.plan(threads=1), seed=1, membership="static")
    node.layout._versions = {w: app.layouts.cached(w) for w in app.workers}
    return node, node.layout


def ticks(keeper: Any) -> Callable[[], int]:
    """How many ticks the layout keeper's thread made from now."""
    count, tick = [0], keeper.tick

    def counted() -> None:
        tick()
        count[0] += 1

    keeper.tick = counted
    return lambda: count[0]


def run_node(app: shardq.App, clock: Skipping) -> tuple[Any, threading.Thread]:

    node = app.node(app.plan(threads=2), seed=1, membership="static")
    app.layouts.clock = clock
    runner = threading.Thread(target=node.run)
    runner.start()
    return node, runner


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_with_a_retry_hidden_stays_open_and_the_others_close(
    moved: shardq.App,
) -> None:
    # given Z stuck in Sticky's old shard 0 (its job retries in 30 s, 1 more behind
    # it), Y done; a node running on a clock the test moves
    z = next(f"z{i}" for i in range(1000) if shard_for(f"z{i}", 2) == 0)
    y = next(f"y{i}" for i in range(1000) if shard_for(f"y{i}", 2) == 0)
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Sticky.publish_many([(z, {"stuck": True}), (z, {"n": 1}), (y, {"n": 0})])
    node, runner = run_node(moved, clock)
    try:
        wait_for(lambda: (y, [{"n": 0}]) in performed and (z, [{"stuck": True}]) in performed, 60)
        # when Sticky is resharded to 3, switched, and the trust window passes
        layout = reshard.start(moved, "Sticky", 3)
        moved.layouts.update("Sticky", lambda w: rules.switch(w, layout.gen))
        clock.offset = 100.0
        # then old shard 1 (empty) closes, while shard 0 stays open behind Z's retry
        wait_for(lambda: moved.layouts.read("Sticky").moving.closed == (1,), 60)  # type: ignore[union-attr]
        ticked = ticks(node.layout)
        wait_for(lambda: ticked() >= 3, 30)  # the keeper looked again, more than once
        assert moved.layouts.read("Sticky").moving.closed == (1,)  # type: ignore[union-attr]
        assert f"Sticky:{moved.shard_queue('Sticky', 0, 0)}" not in node.layout.relaying
    finally:
        node.stop()
        runner.join(30)


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_whose_last_job_a_receive_of_the_node_took_meanwhile_stays_open(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E in Moved's old shard 0, a reshard to 3 switched, and a node (not
    # running: its layout keeper is driven here) past the trust window on its clock
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    e = entity_in(0, 2)
    Moved.publish(e, {"n": 0})
    switched(moved, 3)
    node, keeper = driven(moved)
    clock.offset = 100.0
    # when, while the keeper looks at old shard 0, the node's own receive takes E's job
    # (held, about to run) and the broker's counts, approximate on SQS, show nothing yet
    old = moved.shard_queue("Moved", 0, 0)
    lagging = moved.broker.counts

    def counts(queue: str) -> Any:
        if queue == old:
            node.leases.hold(take(moved.broker, old), 30)
            return QueueCounts(0, 0)
        return lagging(queue)

    monkeypatch.setattr(moved.broker, "counts", counts)
    keeper.tick()
    # then shard 0 does not close (E's job would be relayed behind E's later jobs),
    # while the empty old shard 1 does
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}
    assert [m.group_id for m in node.leases.held()] == [e]


def counts_lag(app: shardq.App, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """Make the broker's counts (approximate on SQS) show nothing in Moved's old shard 0;
    returns that queue and the broker's own counts."""
    old, counts = app.shard_queue("Moved", 0, 0), app.broker.counts
    monkeypatch.setattr(
        app.broker, "counts", lambda q: QueueCounts(0, 0) if q == old else counts(q)
    )
    return old, counts


def served_long(app: shardq.App, monkeypatch: pytest.MonkeyPatch) -> tuple[Skipping, Any, Any, str]:
    """A reshard of Moved to 3 switched 100 s ago on the returned clock, a node (and its
    keeper, driven by hand) serving the old shards since, and the broker's counts showing
    nothing in old shard 0 (:func:`counts_lag`): ``(clock, node, keeper, that queue)``."""
    clock = Skipping()
    app.layouts.clock = clock
    app.ensure_queues()
    switched(app, 3)
    node, keeper = driven(app)
    old, _ = counts_lag(app, monkeypatch)
    clock.offset = 100.0
    return clock, node, keeper, old


def receive_in_flight(
    node: Any, ref: ShardRef, monkeypatch: pytest.MonkeyPatch, fails: bool = False
) -> Callable[[], None]:
    """Start a receive of ``ref`` by the node's intake (as its lane does) that takes what
    the queue holds at once but answers only once the function returned is called (with
    a BrokerError if ``fails``: the answer lost)."""
    shard, receive = node.make_shard(ref), node.app.broker.receive
    took, answer, first = threading.Event(), threading.Event(), [True]

    def slow(queue: str, **kwargs: Any) -> list[Message]:
        messages = receive(queue, **kwargs)
        if queue == shard.queue and kwargs["visibility_timeout"] and first:  # not a look's
            first.clear()
            took.set()
            answer.wait(10)
            if fails:
                raise BrokerError("the answer was lost (test)")
        return messages

    monkeypatch.setattr(node.app.broker, "receive", slow)
    lane = threading.Thread(target=node.intake.receive, args=(shard, 0))
    lane.start()
    assert took.wait(10)

    def let_go() -> None:
        answer.set()
        lane.join(10)

    return let_go


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_whose_last_job_a_receive_in_flight_took_stays_open(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E in Moved's old shard 0 (as a retry this node hid is once visible
    # again), a reshard to 3 switched, and a node (its layout keeper driven here) past the trust
    # window on its clock, the broker's counts (approximate on SQS) showing nothing
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    e = entity_in(0, 2)
    Moved.publish(e, {"n": 0})
    switched(moved, 3)
    node, keeper = driven(moved)
    clock.offset = 100.0
    counts_lag(moved, monkeypatch)
    # when a lane's receive of shard 0, in flight while the keeper looks, took E's job
    # at the broker, and its answer (holding the job here) comes after that look
    let_go = receive_in_flight(node, ShardRef("Moved", 0, 0), monkeypatch)
    keeper.tick()
    let_go()
    clock.offset += 2.5
    keeper.tick()
    # then shard 0 does not close (E's job would be relayed behind E's later jobs),
    # while the empty old shard 1 does
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}
    assert [m.group_id for m in node.leases.held()] == [e]


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_whose_last_job_a_receive_that_failed_took_stays_open(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E in Moved's old shard 0, a reshard to 3 switched, and a node (its
    # layout keeper driven here) past the trust window on its clock, the broker's counts
    # (approximate on SQS) showing nothing
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    switched(moved, 3)
    node, keeper = driven(moved)
    clock.offset = 100.0
    old, counts = counts_lag(moved, monkeypatch)
    # when a lane's receive of shard 0, in flight while the keeper looks, took E's job at
    # the broker and then failed (its answer lost after the retries), and the keeper
    # looks again 2 s later
    let_go = receive_in_flight(node, ShardRef("Moved", 0, 0), monkeypatch, fails=True)
    keeper.tick()
    let_go()
    assert node.intake.receives(old)[0] == 1  # counted as having brought something
    for _ in range(3):  # (the first look after it starts over: the later ones stay open
        clock.offset += 2.5  # only for the failed receive's visibility timeout)
        keeper.tick()
        # then shard 0 stays open while E's job is hidden there (it would be relayed
        # behind E's later jobs), while the empty old shard 1 closed
        assert counts(old).in_flight == 1  # (the broker's own counts: exact here)
        assert keeper.relaying == {ShardRef("Moved", 1, 0).key}


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_closes_once_the_receives_in_flight_at_its_look_brought_nothing(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given Moved's old shards empty, a reshard to 3 switched, and a node (its layout
    # keeper driven here) past the trust window on its clock
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    switched(moved, 3)
    node, keeper = driven(moved)
    clock.offset = 100.0
    # when a lane's receive of shard 0 is in flight at each look (long polls, as on SQS),
    # the one in flight at the first look ending with nothing before the next look
    shard0 = ShardRef("Moved", 0, 0)
    let_go = receive_in_flight(node, shard0, monkeypatch)
    keeper.tick()
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}  # (none in flight there)
    let_go()
    let_go = receive_in_flight(node, shard0, monkeypatch)
    clock.offset += 2.5
    keeper.tick()
    let_go()
    # then shard 0 closes at that next look
    assert shard0.key in keeper.relaying


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_that_holds_a_job_again_at_the_look_that_would_close_it_stays_open(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E in Moved's old shard 0 hidden at the broker (taken by a node that
    # served the shard before), a reshard to 3 switched, and a node (its layout keeper
    # driven here) past the trust window on its clock, the broker's counts (approximate on
    # SQS) showing nothing
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    switched(moved, 3)
    old, counts = moved.shard_queue("Moved", 0, 0), moved.broker.counts
    taken = take(moved.broker, old)
    node, keeper = driven(moved)
    clock.offset = 100.0
    monkeypatch.setattr(
        moved.broker, "counts", lambda q: QueueCounts(0, 0) if q == old else counts(q)
    )
    # when the keeper finds shard 0 empty while a lane's receive of it is in flight, the
    # job is visible again before that receive ends (bringing nothing), and the keeper
    # looks again 2 s later
    let_go = receive_in_flight(node, ShardRef("Moved", 0, 0), monkeypatch)
    keeper.tick()
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}
    release_now(moved.broker, taken)
    let_go()
    clock.offset += 2.5
    keeper.tick()
    # then shard 0 stays open: the job waiting there is not relayed behind E's later jobs
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_taken_over_stays_open_while_its_last_owner_s_job_may_be_hidden(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E in Moved's old shard 0 taken by the node that served the shard
    # before (killed: hidden for the worker's visibility timeout, 60 s), a reshard to 3
    # switched long ago, the broker's counts (approximate on SQS) showing nothing
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    switched(moved, 3)
    old, _ = counts_lag(moved, monkeypatch)
    taken = take(moved.broker, old)
    clock.offset = 100.0
    # when a node takes the old shards over now and looks at them
    _, keeper = driven(moved)
    keeper.tick()
    # then neither closes yet, though a receive finds both empty
    assert keeper.relaying == set()
    # when the dead owner's job is visible again within the visibility timeout, and the
    # node looks once that timeout (and 5 s) passed since it took the shards
    release_now(moved.broker, taken)
    clock.offset += 66
    keeper.tick()
    # then shard 0, holding E's job, stays open (the job is not relayed behind E's later
    # jobs), while the empty old shard 1 closes
    assert keeper.relaying == {ShardRef("Moved", 1, 0).key}


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_dropped_and_taken_back_between_two_looks_waits_again(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a reshard to 3 switched long ago, a node serving the old shards for long, and
    # the broker's counts (approximate on SQS) showing nothing
    clock, node, keeper, old = served_long(moved, monkeypatch)
    # when, between two looks, the node gives shard 0 up, another node takes a job of it
    # (hidden for its visibility timeout), and the node takes the shard back
    keeper.tick()  # (both close at once: served long, found empty)
    shard0 = next(r for r in node.shard_refs() if (r.shard, r.gen) == (0, 0))
    assert shard0.key in keeper.relaying
    node.drop_shard(shard0)
    Moved.publish(entity_in(0, 2), {"n": 0})
    take(moved.broker, old)
    node.add_shard(shard0)
    clock.offset += 2.5
    keeper.tick()
    # then shard 0 does not close while that job may be hidden there
    assert shard0.key not in keeper.relaying


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_an_old_shard_given_up_while_the_look_marks_it_closing_is_not_left_marked(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a reshard to 3 switched long ago, a node serving the old shards for long, and
    # the broker's counts (approximate on SQS) showing nothing
    clock, node, keeper, old = served_long(moved, monkeypatch)
    shard0 = next(r for r in node.shard_refs() if (r.shard, r.gen) == (0, 0))

    class Racing(set[str]):
        """The node gives shard 0 up (its lease watch fences it) just as the look that
        found it closable marks it."""

        def add(self, key: str) -> None:
            if key == shard0.key:
                node.drop_shard(shard0)
            super().add(key)

    keeper.relaying = Racing()
    # when that look ends, and the node takes the shard back after another node took a
    # job of it (hidden at the broker)
    keeper.tick()
    Moved.publish(entity_in(0, 2), {"n": 0})
    take(moved.broker, old)
    node.add_shard(shard0)
    # then the shard taken back does not relay, nor close at the next look
    assert keeper.route(shard0, entity_in(0, 2)) == rules.RUN
    clock.offset += 2.5
    keeper.tick()
    assert shard0.key not in keeper.relaying


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_look_at_the_old_shards_lists_the_jobs_held_twice_whatever_their_number(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given Moved's two old shards empty, a reshard to 3 switched, and a node (its layout
    # keeper driven here) past the trust window on its clock
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    switched(moved, 3)
    node, keeper = driven(moved)
    clock.offset = 100.0
    lists, held = [], node.leases.held
    monkeypatch.setattr(node.leases, "held", lambda *a: lists.append(1) or held(*a))
    # when the keeper looks at them (and closes both)
    keeper.tick()
    assert keeper.relaying == {ShardRef("Moved", s, 0).key for s in (0, 1)}
    # then it listed the jobs held (a copy made under the lock the lanes use) twice: before
    # the receives and after, not twice for each old shard besides
    assert len(lists) == 2


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_look_lists_the_jobs_held_only_when_it_looks_at_an_old_shard_and_once_after(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given Moved's two old shards empty, a reshard to 3 switched, and a node (its layout
    # keeper driven here) on its clock
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    switched(moved, 3)
    node, keeper = driven(moved)
    lists, held = [], node.leases.held
    monkeypatch.setattr(node.leases, "held", lambda *a: lists.append(1) or held(*a))
    # when it looks while the trust window has not passed since the switch
    keeper.tick()
    # then it did not list the jobs held (a copy made under the lock the lanes use)
    assert not lists and not keeper.relaying
    # when the window passed and its shards relay, then it lists them once a look, to
    # learn whether anything of them still runs here
    clock.offset = 100.0
    keeper.tick()
    assert keeper.relaying == {ShardRef("Moved", s, 0).key for s in (0, 1)}
    lists.clear()
    clock.offset += 2.5
    keeper.tick()
    assert len(lists) == 1


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_node_looks_at_an_old_shard_left_to_close_every_2_s_on_its_clock(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job waiting in Moved's old shard 0, a reshard to 3 switched, and a node
    # (its layout keeper driven here) past the trust window on its clock
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    switched(moved, 3)
    _node, keeper = driven(moved)
    clock.offset = 100.0
    old, asked = moved.shard_queue("Moved", 0, 0), []
    counts = moved.broker.counts
    monkeypatch.setattr(moved.broker, "counts", lambda q: asked.append(q) or counts(q))
    # when its keeper ticks 4 times within 2 s (it ticks every 0.5 s), then it asked the
    # broker about the shard once (docs: "every 2 s"); 2 s later, once more
    for _ in range(4):
        keeper.tick()
        clock.offset += 0.45
    assert asked.count(old) == 1
    clock.offset += 0.5
    keeper.tick()
    assert asked.count(old) == 2


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_node_that_reads_a_reshard_announced_elsewhere_reads_again_2_s_later(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node (its layout keeper driven here) reading the stable layouts every 10 s
    config = Config(queue_prefix=moved.config.queue_prefix, layout_refresh_seconds=10)
    moved.configure(config, broker=moved.broker)
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    _, keeper = driven(moved)
    reads: list[float] = []
    refresh = moved.layouts.refresh
    monkeypatch.setattr(moved.layouts, "refresh", lambda: reads.append(clock()) or refresh())
    keeper.tick()
    # when another process announces a reshard of Moved and the next read (10 s on) sees it
    other = shardq.App(config, broker=moved.broker, store=moved.store)
    other.register(type("Moved", (shardq.Worker,), {"shards": 2, "perform": _perform}))
    reshard.start(other, "Moved", 3, by="test")
    clock.offset += 10.1
    keeper.tick()
    assert len(reads) == 2 and moved.layouts.moving()
    # then the node reads them again 2 s later (docs: every 2 s while a reshard is in
    # progress), not 10 s later
    clock.offset += 2.1
    keeper.tick()
    assert len(reads) == 3


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_retired_queue_whose_sweep_could_not_relay_its_job_is_not_deleted_over_it(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job of E left in Moved's retired shard 0 (the move 2 -> 3 ended), and a
    # node (its layout keeper driven here) twice the trust window past the move's end
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    e = entity_in(0, 2)
    Moved.publish(e, {"n": 0})
    switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(rules.close(w, 0, 0), 0, 1))
    _node, keeper = driven(moved)
    clock.offset = 200.0
    # when its sweep receives the job but cannot relay it (the new queue refuses), and
    # it looks again 10 s later, the broker's counts (approximate on SQS) showing nothing
    old = moved.shard_queue("Moved", 0, 0)
    counts, send = moved.broker.counts, moved.broker.send_batch

    def refused(queue: str, entries: Any) -> Any:
        raise BrokerError("the new queue is unreachable (test)")

    monkeypatch.setattr(
        moved.broker, "counts", lambda q: QueueCounts(0, 0) if q == old else counts(q)
    )
    monkeypatch.setattr(moved.broker, "send_batch", refused)
    keeper.tick()
    monkeypatch.setattr(moved.broker, "send_batch", send)
    clock.offset += 10.5
    keeper.tick()
    # then the retired queue is not deleted while the job it received is hidden there
    assert counts(old).in_flight == 1  # (the broker's own counts: exact here)
    assert moved.layouts.read("Moved").retired[0].left == [0]


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # SQS never stored such a body
def test_a_retired_queue_s_job_the_new_queue_refuses_for_good_is_buried_by_the_sweep(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job an older shardq stored with U+FFFE left in Moved's retired shard 0, then
    # a later one, and a node (its layout keeper driven here) past the move's end
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    e, old = entity_in(0, 2), moved.shard_queue("Moved", 0, 0)
    stored_by_older_shardq(moved, old, e, monkeypatch)
    Moved.publish(e, {"n": 2})
    layout = switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(rules.close(w, 0, 0), 0, 1))
    _node, keeper = driven(moved)
    clock.offset = 200.0
    # when its sweep looks at the retired queue
    keeper.tick()
    # then the refused job is in the morgue as invalid, the later one relayed, and the
    # retired queue holds nothing
    (dead,) = Morgue(moved, "Moved").list_jobs()
    assert dead.reason == "invalid_message" and "'\\ufffe'" in dead.error_message
    new = moved.shard_queue("Moved", shard_for(e, 3), layout.gen)
    assert [_n(m) for m in take(moved.broker, new)] == [2]
    counts = moved.broker.counts(old)
    assert (counts.waiting, counts.in_flight) == (0, 0)


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_retired_queue_swept_after_slow_failed_relays_is_not_deleted_over_its_job(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job in each of Moved's retired shards 0 and 1 (the move 2 -> 3 ended), and a
    # node (its layout keeper driven here) twice the trust window past the move's end
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    Moved.publish(entity_in(1, 2), {"n": 1})
    switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(rules.close(w, 0, 0), 0, 1))
    _node, keeper = driven(moved)
    clock.offset = 200.0
    # when one sweep receives both jobs but each relay fails after 12 s of retries (the new
    # queue unreachable), so shard 1's job was received 12 s into it, and the sweep looks
    # again 40.5 s after it began, the broker's counts (approximate on SQS) showing nothing
    second = moved.shard_queue("Moved", 1, 0)
    counts, send = moved.broker.counts, moved.broker.send_batch

    def refused(queue: str, entries: Any) -> Any:
        clock.offset += 12.0
        raise BrokerError("the new queue is unreachable (test)")

    monkeypatch.setattr(
        moved.broker, "counts", lambda q: QueueCounts(0, 0) if q == second else counts(q)
    )
    monkeypatch.setattr(moved.broker, "send_batch", refused)
    began = clock()
    keeper.tick()
    monkeypatch.setattr(moved.broker, "send_batch", send)
    clock.offset += began + 40.5 - clock()
    keeper.tick()
    # then shard 1's queue is not deleted while the job received there is hidden (30 s
    # from its receive: until 42 s in)
    assert counts(second).in_flight == 1  # (the broker's own counts: exact here)
    assert moved.layouts.read("Moved").retired[0].left == [0, 1]


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_retired_queue_whose_sweep_receive_failed_is_not_deleted_over_the_job_it_took(
    moved: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a job left in Moved's retired shard 0 (the move 2 -> 3 ended), and a node
    # (its layout keeper driven here) twice the trust window past the move's end
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    Moved.publish(entity_in(0, 2), {"n": 0})
    switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(rules.close(w, 0, 0), 0, 1))
    _node, keeper = driven(moved)
    clock.offset = 200.0
    # when its sweep's receive takes the job at the broker but fails (the answer lost after
    # the retries), and it looks again 10 s later, the counts (approximate on SQS) empty
    old = moved.shard_queue("Moved", 0, 0)
    counts, receive = moved.broker.counts, moved.broker.receive
    lost = [True]

    def lossy(queue: str, **kwargs: Any) -> list[Message]:
        messages = receive(queue, **kwargs)
        if queue == old and messages and lost:
            lost.clear()
            raise BrokerError("the answer was lost (test)")
        return messages

    monkeypatch.setattr(
        moved.broker, "counts", lambda q: QueueCounts(0, 0) if q == old else counts(q)
    )
    monkeypatch.setattr(moved.broker, "receive", lossy)
    keeper.tick()
    clock.offset += 10.5
    keeper.tick()
    # then the retired queue is not deleted while the job it took is hidden there
    assert counts(old).in_flight == 1  # (the broker's own counts: exact here)
    assert moved.layouts.read("Moved").retired[0].left == [0]


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_node_forgets_the_queues_of_the_shards_it_dropped_and_the_queues_it_deleted(
    moved: shardq.App,
) -> None:
    # given Moved resharded 2 -> 3 and the move ended (its retired queues empty), and a
    # node (its layout keeper driven here) serving the new shards, twice the trust window
    # past the move's end
    clock = Skipping()
    moved.layouts.clock = clock
    moved.ensure_queues()
    switched(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(rules.close(w, 0, 0), 0, 1))
    node, keeper = driven(moved)
    intake = node.intake
    clock.offset = 200.0
    # when its keeper sweeps and deletes the retired queues, and its lanes received each
    # shard before the node dropped them all
    keeper.tick()
    assert moved.layouts.read("Moved").retired == ()
    refs = node.shard_refs()
    for ref in refs:
        intake.receive(node.make_shard(ref), 0)
        node.drop_shard(ref)
    # then it keeps nothing about those queues (a node running for weeks through many
    # reshards would otherwise keep every queue it ever received or swept)
    assert refs and not keeper._swept and not keeper._unrelayed
    assert not intake._brought and not intake._receiving


@pytest.mark.parametrize("moved", ["sqlite"], indirect=True)  # the same on every broker
def test_a_reshard_announced_while_no_node_runs_completes_once_a_node_runs(
    moved: shardq.App,
) -> None:
    # (as after every node was killed, or `shardq reshard --no-wait`)
    # given jobs of 20 entities in the old layout, a reshard from 2 to 3 shards
    # announced while no node runs, and a node started on a clock the test moves
    clock = Skipping()
    moved.ensure_queues()
    Moved.publish_many([(f"e{i}", {"n": 0}) for i in range(20)])
    begin(moved, 3)
    moved.layouts.clock = clock
    node, runner = run_node(moved, clock)
    try:
        # when the trust window passes on the node's clock (it writes the switch),
        # jobs are published to the new layout, and it passes again
        clock.offset = 61.0
        wait_for(lambda: moved.layouts.read("Moved").state == "switched", 60)
        moved.layouts.forget()
        Moved.publish_many([(f"e{i}", {"n": 1}) for i in range(20)])
        clock.offset = 200.0
        # then the reshard completes and every entity ran its jobs in order
        wait_for(lambda: moved.layouts.read("Moved").moving is None, 30)
        wait_for(lambda: len(performed) == 40, 60)
        for i in range(20):
            mine = [p for entity, p in performed if entity == f"e{i}"]
            assert mine == [[{"n": 0}], [{"n": 1}]]
        # and, twice the trust window later, the retired queues are deleted
        clock.offset = 400.0
        wait_for(lambda: not moved.layouts.read("Moved").retired, 30)
    finally:
        node.stop()
        runner.join(30)
