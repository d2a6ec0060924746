"""Resharding inside a process: where publishers send, what a node's executor does with
a job of a moved entity (wait, run or relay), and what ``shardq reshard`` refuses."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq import envelope, reshard
from shardq import layout as rules
from shardq.broker import Broker, Message
from shardq.cli import main
from shardq.config import Config
from shardq.errors import LayoutError
from shardq.executor import Executor
from shardq.leases import Leases
from shardq.plan import ShardRef
from shardq.sharding import shard_for
from shardq.stats import collect
from shardq.timelimit import TimeLimits
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
    yield app
    broker.close()


def begin(app: shardq.App, shards: int, trust: float = 0.0) -> rules.WorkerLayout:
    """A reshard of Moved begun now (the pure step with a chosen trust window)."""
    app.ensure_queues()
    for s in range(shards):
        app.ensure_queue(app.shard_queue("Moved", s, app.layouts.get("Moved").gen + 1), "Moved")
    return app.layouts.update(
        "Moved", lambda w: rules.start(w, "Moved", shards, time.time(), "test", trust)
    )


def take(broker: Broker, queue: str) -> list[Message]:
    return broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)


def executor(app: shardq.App) -> tuple[Executor, Leases]:
    leases = Leases(app.broker, ThreadPoolExecutor(2), interval=0.2)
    leases.start()
    return Executor(app, leases, TimeLimits(), threading.Event()), leases


def entity_in(old_shard: int, shards: int) -> str:
    return next(f"e{i}" for i in range(1000) if shard_for(f"e{i}", shards) == old_shard)


def test_publishers_send_to_the_new_generation_once_a_reshard_begins(moved: shardq.App) -> None:
    # given a reshard of Moved from 2 to 5 shards begun
    layout = begin(moved, 5)
    # when an entity's job is published (the publisher's copy may be 0.1 s old)
    time.sleep(0.15)
    Moved.publish("order-7", {"n": 1})
    # then it is in the entity's shard of generation 1, not in the old layout
    queue = moved.shard_queue("Moved", shard_for("order-7", 5), layout.gen)
    assert [m.group_id for m in take(moved.broker, queue)] == ["order-7"]
    old = moved.shard_queue("Moved", shard_for("order-7", 2), 0)
    assert take(moved.broker, old) == []


def test_publishers_keep_the_old_layout_until_the_switch_time(moved: shardq.App) -> None:
    # given a reshard begun whose switch time is a minute away
    begin(moved, 5, trust=60.0)
    time.sleep(0.15)
    # when a job is published, then it goes to the old layout, where it runs as before
    Moved.publish("order-7", {"n": 1})
    old = moved.shard_queue("Moved", shard_for("order-7", 2), 0)
    assert [m.group_id for m in take(moved.broker, old)] == ["order-7"]
    assert rules.publish_to(moved.layouts.cached("Moved"), time.time() + 61) == (1, 5)


def test_a_moved_entity_waits_while_its_old_shard_is_open_then_runs(moved: shardq.App) -> None:
    # given a reshard begun, and a job of an entity published to the new layout
    layout = begin(moved, 4)
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
    moved.layouts.update("Moved", lambda w: rules.close(w, 0, time.time()))
    assert run.run_batch(ref, messages) == []
    assert performed == [(entity, [{"n": 1}])]
    leases.close(5)


def test_an_entity_whose_old_shard_closed_runs_at_once(moved: shardq.App) -> None:
    # given a reshard whose old shard 1 closed (shard 0 still open)
    layout = begin(moved, 4)
    moved.layouts.update("Moved", lambda w: rules.close(w, 1, time.time()))
    entity = entity_in(1, 2)
    Moved.publish(entity, {"n": 1})
    ref = ShardRef("Moved", shard_for(entity, 4), 1, layout.gen)
    run, leases = executor(moved)
    messages = take(moved.broker, moved.shard_queue("Moved", ref.shard, ref.gen))
    leases.hold(messages, 30)
    # when it is received, then it runs without waiting for shard 0
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
    layout = begin(moved, 3)
    moved.layouts.update("Moved", lambda w: rules.close(w, 0, time.time()))
    new = moved.shard_queue("Moved", shard_for(entity, 3), layout.gen)
    time.sleep(0.15)
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


def test_a_publisher_whose_queue_was_deleted_publishes_to_the_live_layout(
    moved: shardq.App,
) -> None:
    # given a publisher that knows generation 0, and a reshard whose old queues are gone
    moved.ensure_queues()
    Moved.publish("order-1", {"n": 0})
    assert moved.layouts.cached("Moved").gen == 0
    layout = begin(moved, 3)
    for shard in range(2):
        moved.layouts.update("Moved", lambda w, s=shard: rules.close(w, s, time.time()))
    for shard in range(2):
        moved.broker.delete_queue(moved.shard_queue("Moved", shard, 0))
    moved.layouts._doc = None  # its copy from before the reshard
    moved.layouts._read_at = time.monotonic()
    # when it publishes, then the job lands in the live layout, nothing is refused
    report = moved.publisher.publish_many("Moved", [("order-1", {"n": 1})])
    assert report.sent == 1
    queue = moved.shard_queue("Moved", shard_for("order-1", 3), layout.gen)
    assert [m.group_id for m in take(moved.broker, queue)] == ["order-1"]


def test_a_second_reshard_while_one_runs_is_refused(moved: shardq.App) -> None:
    # given a reshard under way
    begin(moved, 4, trust=60.0)
    # when another is asked for, then it is refused, naming the one running
    with pytest.raises(LayoutError, match="from 2 to 4 shards is in progress"):
        reshard.start(moved, "Moved", 8)
    # and the document still shows the first one
    assert moved.layouts.get("Moved", max_age=0).shards == 4


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
    # and a good one begins (no node runs: --no-wait returns)
    assert main(["reshard", "Moved", "--shards", "3", "--no-wait", *base]) == 0
    assert "reshard from 2 to 3 shards begun" in capsys.readouterr().out
    assert main(["reshard", "Moved", "--shards", "5", *base]) == 2
    assert "is in progress" in capsys.readouterr().err


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


def test_an_entity_stuck_in_its_old_shard_holds_back_only_itself(
    moved: shardq.App, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params["moved"] != "sqlite":
        pytest.skip("the narrowing is the same on every broker; this one is quick")
    # given two entities of one old shard: Z stuck (its job retries every 30 s, with
    # 3 more jobs behind it), Y done; a node running
    from shardq.node import Node

    z = next(f"z{i}" for i in range(1000) if shard_for(f"z{i}", 2) == 0)
    y = next(f"y{i}" for i in range(1000) if shard_for(f"y{i}", 2) == 0)
    moved.ensure_queues()
    Sticky.publish_many([(z, {"stuck": True}), *[(z, {"n": n}) for n in range(3)], (y, {"n": 0})])
    node = Node(moved, moved.plan(threads=2), seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    try:
        wait_for(lambda: (y, [{"n": 0}]) in performed, 10)
        # when Sticky is resharded to 3 (switching at once) and both publish again
        moved.layouts.update(
            "Sticky", lambda w: rules.start(w, "Sticky", 3, time.time(), "test", 0.0)
        )
        time.sleep(0.3)
        Sticky.publish_many([(y, {"n": 1}), (z, {"n": 3})])
        # then Y's new job runs once the old shard is narrowed to Z (a few seconds),
        # while Z's new job waits behind its stuck one
        wait_for(lambda: (y, [{"n": 1}]) in performed, 30)
        move = moved.layouts.get("Sticky", max_age=0).moving
        assert move is not None and move.pending == {0: (z,)}
        # and `shardq stats` says so
        reshard_view = collect(moved).to_dict()["by_worker"]["Sticky"]["layout"]["reshard"]
        assert reshard_view["narrowed"] == {"0": [z]}
        assert all(entity != z or p != [{"n": 3}] for entity, p in performed)
    finally:
        node.stop()
        runner.join(30)


def wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_reshard_begun_while_no_node_runs_completes_once_nodes_run(
    moved: shardq.App, request: pytest.FixtureRequest
) -> None:
    # (as after every node was killed: the state is in the layout document)
    if request.node.callspec.params["moved"] != "sqlite":
        pytest.skip("the same on every broker; this one is quick")
    from shardq.node import Node

    # given jobs of 20 entities in the old layout, and a reshard from 2 to 3 shards
    # begun (switching at once) while no node runs, then jobs in the new layout
    moved.ensure_queues()
    Moved.publish_many([(f"e{i}", {"n": 0}) for i in range(20)])
    begin(moved, 3)
    time.sleep(0.15)
    Moved.publish_many([(f"e{i}", {"n": 1}) for i in range(20)])
    # when a node starts
    node = Node(moved, moved.plan(threads=2), seed=1, membership="static")
    runner = threading.Thread(target=node.run)
    runner.start()
    try:
        # then the reshard completes and every entity ran its jobs in order
        wait_for(lambda: moved.layouts.get("Moved", max_age=0).moving is None, 40)
        wait_for(lambda: len(performed) == 40, 10)
        for i in range(20):
            mine = [p for entity, p in performed if entity == f"e{i}"]
            assert mine == [[{"n": 0}], [{"n": 1}]]
    finally:
        node.stop()
        runner.join(30)
