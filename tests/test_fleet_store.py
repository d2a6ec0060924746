"""The fleet document and its store, on every broker (a real emulator for SQS)."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from shardq.broker import Broker, SendEntry
from shardq.errors import FleetError
from shardq.fleet_doc import FleetDoc, NodeReport
from shardq.fleet_store import GROUP, FleetStore


def report(node: str, **kw: object) -> NodeReport:
    base = NodeReport(node=node, host="h", pid=1, started=1.0, seen=2.0)
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(broker: Broker) -> FleetStore:
    s = FleetStore(broker, f"fleet-{uuid.uuid4().hex[:8]}.fifo", lock_seconds=3)
    s.ensure()
    return s


def bump(doc: FleetDoc, node: str = "n") -> FleetDoc:
    old = doc.nodes.get(node)
    return doc.with_node(report(node, done=(old.done if old else 0) + 1))


def test_no_document_reads_as_none(store: FleetStore) -> None:
    assert store.read() is None


def test_update_creates_then_each_write_is_one_version_higher(store: FleetStore) -> None:
    # when
    first = store.update(bump)
    second = store.update(bump)
    # then
    assert (first.version, second.version) == (1, 2)
    read = store.read()
    assert read is not None and read.version == 2 and read.nodes["n"].done == 2


def test_concurrent_writers_lose_no_update(store: FleetStore) -> None:
    # given four writers, each adding one to its own count and to a shared one ten times
    def writer(name: str) -> None:
        for _ in range(10):
            store.update(lambda d: bump(bump(d, name), "shared"), timeout=60)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # then every increment is there
    doc = store.read()
    assert doc is not None
    assert doc.nodes["shared"].done == 40
    assert all(doc.nodes[f"w{i}"].done == 10 for i in range(4))
    assert doc.version == 40


def test_a_writer_that_died_holding_the_lock_delays_the_next_by_the_lock_only(
    store: FleetStore, broker: Broker
) -> None:
    # given a writer that received the document (the lock) and died
    store.update(bump)
    held = broker.receive(store.queue, max_messages=10, wait_seconds=0, visibility_timeout=3)
    assert held
    # when another writes
    started = time.monotonic()
    doc = store.update(bump, timeout=30)
    # then it waited for the lock to lapse and lost nothing
    assert 1.0 < time.monotonic() - started < 15
    assert doc.nodes["n"].done == 2


def test_a_writer_that_died_between_send_and_delete_leaves_a_readable_newest(
    store: FleetStore, broker: Broker
) -> None:
    # given two versions in the group (the old one not deleted)
    store.update(bump)
    newer = replace(bump(FleetDoc(version=1)), version=5)
    broker.send_batch(store.queue, [SendEntry("0", newer.to_text(), GROUP, uuid.uuid4().hex)])
    # then a reader takes the newest, and the next writer builds on it and cleans up
    read = store.read()
    assert read is not None and read.version == 5
    assert store.update(bump).version == 6
    after = broker.receive(store.queue, max_messages=10, wait_seconds=0, visibility_timeout=0)
    assert [FleetDoc.from_text(m.body).version for m in after] == [6]


def test_a_document_from_a_newer_shardq_is_refused(store: FleetStore, broker: Broker) -> None:
    text = FleetDoc().to_text().replace('"format":1', '"format":99')
    broker.send_batch(store.queue, [SendEntry("0", text, GROUP, uuid.uuid4().hex)])
    with pytest.raises(FleetError, match="upgrade shardq"):
        store.read()
    with pytest.raises(FleetError, match="upgrade shardq"):
        store.update(bump)


def test_a_malformed_document_is_logged_and_replaced(store: FleetStore, broker: Broker) -> None:
    broker.send_batch(store.queue, [SendEntry("0", "{not json", GROUP, uuid.uuid4().hex)])
    with capture_logs() as logs:
        doc = store.update(bump)
    assert doc.version == 1 and doc.nodes["n"].done == 1
    assert any(e["event"] == "fleet.bad_document" for e in logs)
    read = store.read()
    assert read is not None and read.version == 1


def test_document_round_trips_and_rejects_wrong_types() -> None:
    doc = (
        FleetDoc(
            version=3,
            written=4.5,
            nodes={"a": report("a", held=("W:0", "W:1"), lags={"W:0": 1.5}, jobs_per_second=2.0)},
            targets={"W:0": "a", "W:1": "a"},
            leases=("W:0", "W:1"),
        )
        .without_node("a", "stopped", 10.0)
        .with_node(report("b"))
    )
    assert FleetDoc.from_text(doc.to_text()) == doc
    assert doc.gone["a"].reason == "stopped"
    bad = doc.to_text().replace('"pid":1', '"pid":"one"')
    with pytest.raises(FleetError, match="'pid' in the fleet document is not an integer"):
        FleetDoc.from_text(bad)


def test_gone_nodes_are_kept_an_hour() -> None:
    doc = FleetDoc(nodes={"a": report("a")}).without_node("a", "lease expired", 100.0)
    assert "a" in doc.pruned(100.0 + 3599).gone
    assert "a" not in doc.pruned(100.0 + 3601).gone
