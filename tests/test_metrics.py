"""A node's Prometheus endpoint, scraped over HTTP while it works."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import shardq
from shardq.core.config import Config
from shardq.core.errors import MetricsServerError
from shardq.run.executor import Outcome
from shardq.run.metrics import NodeMetrics
from shardq.run.shard import Shard
from tests.apps import ledger
from tests.apps.ledger import Ledgered


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse(response.read().decode())


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def jobs(sample: dict, outcome: str) -> float:  # type: ignore[type-arg]
    """Ledgered's jobs with this outcome, whatever node label they carry."""
    return sum(
        value
        for (name, labels), value in sample.items()
        if name == "shardq_jobs_total"
        and dict(labels).get("outcome") == outcome
        and dict(labels).get("worker") == "Ledgered"
    )


def test_the_metrics_endpoint_shows_the_counters_moving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node serving metrics on a free port
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    ledger.reset()
    ledger.app.configure(
        Config(metrics_port=0, idle_wait_seconds=1),
        broker=shardq.SqliteBroker(str(tmp_path / "b.db")),
    )
    node = ledger.app.node(ledger.app.plan(threads=2))
    runner = threading.Thread(target=node.run)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while node.metrics_port is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert node.metrics_port is not None
        before = scrape(node.metrics_port)
        # when jobs succeed, one is retried once, and one goes to the morgue
        Ledgered.publish_many(
            [("a", {"n": 0}), ("b", {"n": 0, "fail": 1}), ("c", {"n": 0, "permanent": True})]
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = scrape(node.metrics_port)
            if jobs(after, "succeeded") == 2 and jobs(after, "morgued") == 1:
                break
            time.sleep(0.1)
        # then the counters moved by exactly that
        assert jobs(before, "succeeded") == 0
        assert (jobs(after, "succeeded"), jobs(after, "retried"), jobs(after, "morgued")) == (
            2,
            1,
            1,
        )
        count = ("shardq_job_duration_seconds_count", (("node", node.id), ("worker", "Ledgered")))
        assert after[count] == 4
        lags = [k for k in after if k[0] == "shardq_shard_lag_seconds"]
        assert len(lags) == 3
        assert ("shardq_in_flight_jobs", (("node", node.id),)) in after
        assert after[("shardq_concurrency", (("node", node.id),))] == 32
    finally:
        node.stop()
        runner.join(30)
    # and the endpoint is closed with the node
    with pytest.raises(OSError):
        scrape(node.metrics_port)


def test_a_port_already_in_use_is_a_clear_error() -> None:
    # given a port another listener holds
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = NodeMetrics(lambda: [], lambda: 0)
        # when the metrics endpoint is asked to serve there
        with pytest.raises(MetricsServerError) as raised:
            metrics.serve(port, "127.0.0.1")
    # then the error names the address and what to do
    assert f"cannot serve metrics on 127.0.0.1:{port}" in str(raised.value)
    assert "pick a free one with --metrics-port" in str(raised.value)
    assert isinstance(raised.value, shardq.ShardqError)


def test_every_metric_carries_the_node_label() -> None:
    # given the metrics of node n-7 holding one shard, after a success and a broker error
    metrics = NodeMetrics(
        lambda: [("Ledgered", 2, 1.5)], lambda: 3, node="n-7", slots=lambda: (5, 32)
    )
    metrics.job_outcome(Outcome("succeeded", "Ledgered", 2, "e", [], [], 0.25))
    metrics.broker_error("receive")
    # when they are exposed
    samples = parse(generate_latest(metrics.registry).decode())
    # then each series names the node
    names = {name for name, _ in samples if name.startswith("shardq_")}
    assert {
        "shardq_jobs_total",
        "shardq_job_duration_seconds_count",
        "shardq_shard_lag_seconds",
        "shardq_in_flight_jobs",
        "shardq_broker_errors_total",
        "shardq_slots_in_use",
        "shardq_concurrency",
    } <= names
    for name, labels in samples:
        if name.startswith("shardq_") and not name.endswith("_created"):
            assert ("node", "n-7") in labels, (name, labels)
    assert samples[("shardq_in_flight_jobs", (("node", "n-7"),))] == 3
    # and the slots in use out of the node's concurrency
    assert samples[("shardq_slots_in_use", (("node", "n-7"),))] == 5
    assert samples[("shardq_concurrency", (("node", "n-7"),))] == 32
    lag = (("node", "n-7"), ("shard", "2"), ("worker", "Ledgered"))
    assert samples[("shardq_shard_lag_seconds", lag)] == 1.5
    # and a node made without an id still works, with an empty label
    assert NodeMetrics(lambda: [], lambda: 0).node == ""


def test_the_jobs_counter_shows_the_tally_the_node_reports_from() -> None:
    # given a node's metrics told of 2 jobs that succeeded and 1 moved to the morgue
    metrics = NodeMetrics(lambda: [], lambda: 0, node="n-1")
    for kind, n in (("succeeded", 2), ("morgued", 1)):
        messages: list[Any] = [None] * n  # stand-ins: only their number counts
        metrics.job_outcome(Outcome(kind, "Ledgered", 0, "e", messages, [], 0.1))
    # when they are scraped
    samples = parse(generate_latest(metrics.registry).decode())
    # then shardq_jobs_total counts what the tally counts, each series with its start time
    assert metrics.tally.succeeded == {"Ledgered": 2} and metrics.tally.morgued == {"Ledgered": 1}
    assert jobs(samples, "succeeded") == 2 and jobs(samples, "morgued") == 1
    created = [v for (name, _), v in samples.items() if name == "shardq_jobs_created"]
    assert len(created) == 2 and all(v > 0 for v in created)


class _Racing(Shard):
    """A shard whose lane starts its last batch between two reads of its head's time."""

    reads = 0

    @property  # type: ignore[override]
    def head_sent_at(self) -> float | None:
        self.reads += 1
        return 100.0 if self.reads % 2 else None

    @head_sent_at.setter
    def head_sent_at(self, value: float | None) -> None:
        pass


def test_lags_read_while_a_lane_empties_a_shard_never_raise() -> None:
    # given a node whose one shard loses its head time while the lags are read
    app = shardq.App(Config(queue_prefix="lag-"), broker=shardq.MemoryBroker())
    app.register(type("Laggy", (shardq.Worker,), {"perform": lambda self, e, p: None}))
    node = app.node(app.plan(threads=1), wall_clock=lambda: 130.0)
    lane = node.lanes[0]
    racing = _Racing(lane.shards[0].ref, lane.shards[0].queue, 30)
    lane.set_shards([racing])
    # when the lags are read (a scrape, node.progress, the heartbeat)
    lags = node.lags()
    # then the shard's lag is the one read, not a TypeError that stops the node
    assert lags == [("Laggy", 0, 30.0)]
