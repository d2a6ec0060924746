"""The web dashboard: its JSON API and security on each broker, and the page in a real
headless Chromium (skipped without Chromium, except on CI where it must run)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import shardq
from shardq import morgue
from shardq.broker import MemoryBroker, Message
from shardq.broker.base import SendEntry
from shardq.core import envelope
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.errors import BrokerError, ConfigError
from shardq.core.topology import shard_for
from shardq.morgue import Morgue
from shardq.morgue.migrate import move_queue_morgue
from shardq.ops.dashboard import DashboardServer, make_server
from shardq.ops.ensure import ensure_state_table
from shardq.ops.sampler import NO_THROUGHPUT, Sampler, parse_metrics
from shardq.ops.stats import collect, current_fleet
from shardq.store import StoreError
from tests.conftest import make_broker
from tests.fleet_items import heartbeat

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "s3cret-token"

app = shardq.App()


class Base(shardq.Worker):
    visibility_timeout = 30

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            if payload.get("error"):
                raise shardq.PermanentError(payload["error"])


@app.register
class SyncOrder(Base):
    shards = 4
    priority = 10


@app.register
class SendReceipt(Base):
    shards = 2
    priority = 3


@app.register
class IndexProduct(Base):
    shards = 3


def run_until_empty(timeout: float = 60) -> None:
    node = app.node(app.plan(threads=2), until_empty=True, seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), "the node did not drain in time"


# The memory broker is the embedded engine on an in-memory file (its store too): the
# dashboard takes the same path on it as on "sqlite", so it is not a kind of its own here
# (tests that need it, e.g. for throughput, name it).
@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def filled(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[shardq.App]:
    """3 dead SyncOrder jobs (2 of o1, 1 of o2), 4 done SendReceipt jobs, then a backlog
    of 5 SyncOrder, 2 SendReceipt and 0 IndexProduct jobs."""
    broker = make_broker(kind, tmp_path, request)
    prefix = f"d{time.monotonic_ns() % 10**9}-"
    app.configure(Config(queue_prefix=prefix, idle_wait_seconds=1), broker=broker)
    ensure_state_table(app)  # DynamoDB's table, as `shardq queues ensure` makes it
    declined = {"error": "card declined"}
    SyncOrder.publish_many(
        [
            ("o1", {"n": 0, **declined}),
            ("o1", {"n": 1, **declined}),
            ("o2", {"n": 0, "error": "unknown sku"}),
        ]
    )
    SendReceipt.publish_many([(f"r{i}", {"n": i}) for i in range(4)])
    run_until_empty()
    SyncOrder.publish_many([(f"o{i}", {"n": i}) for i in range(3, 8)])
    SendReceipt.publish_many([("r9", {"n": 1}), ("r9", {"n": 2})])
    yield app
    broker.close()


@pytest.fixture
def server(filled: shardq.App) -> Iterator[DashboardServer]:
    srv = make_server(filled, "127.0.0.1", 0, refresh=0.2).start()
    yield srv
    srv.stop()


def call(
    srv: DashboardServer, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path.lstrip("/"), data=data, method=method)
    for name, value in headers.items():
        req.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def shard_length(filled: shardq.App, worker: str, entity: str) -> int:
    shards = filled.settings(worker).shards
    counts = filled.broker.counts(filled.shard_queue(worker, shard_for(entity, shards)))
    return counts.waiting + counts.in_flight


# -- API ----------------------------------------------------------------------------
def test_stats_report_the_queues(server: DashboardServer, kind: str) -> None:
    # SQS's counts are approximate: a job released by the stopping node can show as in
    # flight for a moment, so the sample is taken again until the 7 jobs show waiting
    deadline = time.monotonic() + 15
    while True:
        status, stats = call(server, "GET", "/api/v1/stats")
        settled = status == 200 and stats["total"]["length"] == 7
        if settled or kind != "sqs" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200
    assert stats["broker"] == kind
    assert stats["total"]["length"] == 7 and stats["total"]["in_flight"] == 0
    assert stats["total"]["morgue_length"] == 3
    sync, receipt, index = (
        stats["by_worker"][n] for n in ("SyncOrder", "SendReceipt", "IndexProduct")
    )
    assert (sync["length"], sync["morgue_length"], sync["priority"]) == (5, 3, 10)
    assert (receipt["length"], receipt["morgue_length"]) == (2, 0)
    assert index["length"] == 0 and index["lag"] is None
    assert [s["shard"] for s in sync["shards"]] == [0, 1, 2, 3]
    assert sum(s["length"] for s in sync["shards"]) == 5
    expected = shard_length(server.app, "SendReceipt", "r9")
    assert receipt["shards"][shard_for("r9", 2)]["length"] == expected == 2
    if kind == "sqs":
        assert stats["total"]["done"] is None and sync["lag"] is None
        assert stats["throughput"] is None and stats["throughput_note"] == NO_THROUGHPUT
    else:
        assert (sync["done"], receipt["done"], stats["total"]["done"]) == (3, 4, 7)
        assert sync["lag"] is not None and sync["lag"] >= 0
        assert set(stats["throughput"]) == {"SyncOrder", "SendReceipt", "IndexProduct"}


@pytest.mark.parametrize("kind", ["memory"])  # the sampler's schedule is the same on any broker
def test_stats_are_sampled_on_a_schedule_not_per_request(filled: shardq.App) -> None:
    # given a sampler that samples every second, on a clock the test moves
    clock = ManualClock()
    sampler = Sampler(filled, refresh=1.0, clock=clock)
    # when it first steps, it samples at once and steps again within the refresh
    assert sampler.step() == 1.0
    first = sampler.snapshot()["time"]
    # when five requests come, then they read that one sample
    assert {sampler.snapshot()["time"] for _ in range(5)} == {first}
    # and a step before the refresh is over takes no new sample
    clock.advance(0.6)
    assert sampler.step() == pytest.approx(0.4)
    assert sampler.snapshot()["time"] == first
    # and a step once it is over takes a newer one
    clock.advance(0.4)
    sampler.step()
    assert sampler.snapshot()["time"] > first


@pytest.mark.parametrize("kind", ["memory"])  # the sampler's schedule is the same on any broker
def test_a_sample_slower_than_the_refresh_is_not_followed_by_another_at_once(
    filled: shardq.App,
) -> None:
    # given a sampler that samples every 0.1 s, each sample taking 0.5 s on its clock
    clock = ManualClock()
    sampler = Sampler(filled, refresh=0.1, clock=clock)
    sample, samples = sampler.sample, []
    sampler.sample = lambda: (samples.append(1), sample(), clock.advance(0.5))[0]  # type: ignore[method-assign]
    # when it steps, then the next sample is 0.1 s after this one ended, not at once
    assert sampler.step() == pytest.approx(0.1)
    sampler.step()
    assert len(samples) == 1  # (that step read the fleet alone)
    clock.advance(0.1)
    sampler.step()
    assert len(samples) == 2


@pytest.mark.parametrize("kind", ["sqlite", "memory"])  # SQS: see the scrape test
def test_throughput_is_the_change_of_done_between_samples(filled: shardq.App) -> None:
    sampler = Sampler(filled, refresh=5)
    sampler.sample()
    assert all(not points for points in sampler.points.values())
    run_until_empty()  # 5 SyncOrder and 2 SendReceipt jobs done
    sampler.sample()
    ((t, sync_rate),) = sampler.points["SyncOrder"]
    ((_, receipt_rate),) = sampler.points["SendReceipt"]
    assert sync_rate > 0 and receipt_rate == pytest.approx(sync_rate * 2 / 5, rel=0.02)
    snapshot = sampler.snapshot()
    assert snapshot["throughput"]["SyncOrder"] == [[t, sync_rate]]
    assert snapshot["throughput"]["IndexProduct"] == [[t, 0.0]]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_queue_leaving_the_count_is_no_burst_of_throughput(filled: shardq.App) -> None:
    # given samples before and after 7 jobs were done
    sampler = Sampler(filled, refresh=5)
    sampler.sample()
    run_until_empty()
    sampler.sample()
    # when a shard queue that did jobs leaves the count (as a retired generation's do
    # once a reshard ends) and nothing else is done
    queues = [filled.shard_queue("SyncOrder", n) for n in range(4)]
    busiest = max(queues, key=lambda q: filled.broker.counts(q).deleted_total or 0)
    filled.broker.delete_queue(busiest)
    sampler.sample()
    # then no job is counted done since the last sample
    assert sampler.points["SyncOrder"][-1][1] == 0.0
    assert sampler.total[-1][1] == 0.0


def test_an_embedded_broker_counts_throughput_before_its_queues_exist() -> None:
    app.configure(Config(queue_prefix="fresh-"), broker=MemoryBroker())
    sampler = Sampler(app, refresh=5)
    sampler.sample()
    sampler.sample()
    snapshot = sampler.snapshot()
    assert snapshot["throughput_source"] == "broker" and snapshot["throughput_note"] is None
    assert snapshot["throughput"]["SyncOrder"][-1][1] == 0.0
    app.broker.close()


def test_jobs_done_in_a_queue_made_between_two_samples_are_counted() -> None:
    # given a sampler that sampled the embedded broker before any queue was made
    app.configure(Config(queue_prefix="made-", idle_wait_seconds=1), broker=MemoryBroker())
    sampler = Sampler(app, refresh=5)
    sampler.sample()
    before = sampler.snapshot()["time"]
    # when 7 SyncOrder jobs are published (making their queues) and done, then it samples
    SyncOrder.publish_many([("o1", {"n": n}) for n in range(7)])
    run_until_empty()
    sampler.sample()
    snapshot = sampler.snapshot()
    # then the 7 jobs are counted from 0 at the first sample: a point for every worker
    per_minute = 7 * 60 / (snapshot["time"] - before)
    assert snapshot["throughput"]["SyncOrder"][-1][1] == pytest.approx(per_minute, rel=0.01)
    assert snapshot["throughput"]["SendReceipt"][-1][1] == 0.0
    assert snapshot["throughput_total"][-1][1] == pytest.approx(per_minute, rel=0.01)
    app.broker.close()


def test_parse_metrics_sums_finished_jobs_per_worker() -> None:
    text = (
        "# TYPE shardq_jobs counter\n"
        'shardq_jobs_total{worker="SyncOrder",outcome="succeeded"} 10.0\n'
        'shardq_jobs_total{worker="SyncOrder",outcome="morgued"} 2.0\n'
        'shardq_jobs_total{worker="SyncOrder",outcome="retried"} 7.0\n'
        'shardq_jobs_created{worker="SyncOrder",outcome="succeeded"} 1.7e9\n'
        'shardq_jobs_total{worker="SendReceipt",outcome="succeeded"} 3.0\n'
        "# TYPE other_total counter\n"
        'other_total{worker="SyncOrder",outcome="succeeded"} 99.0\n'
    )
    assert parse_metrics(text) == {"SyncOrder": 12.0, "SendReceipt": 3.0}


@pytest.mark.sqs
def test_on_sqs_throughput_comes_from_the_nodes_metrics(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    jobs = Counter("shardq_jobs_total", "Jobs", ["worker", "outcome"], registry=registry)

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    metrics = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    broker = make_broker("sqs", tmp_path, request)
    try:
        app.configure(Config(queue_prefix=f"x{time.monotonic_ns() % 10**9}-"), broker=broker)
        app.store.ensure_table()  # DynamoDB's, as `shardq queues ensure` makes it
        url = f"http://127.0.0.1:{metrics.server_address[1]}/metrics"
        sampler = Sampler(app, refresh=5, scrape=[url, "http://127.0.0.1:9/metrics"])
        jobs.labels("SyncOrder", "succeeded").inc(100)
        sampler.sample()  # the second URL does not answer: no point, no dip
        assert sampler.snapshot()["throughput_source"] == "scrape"
        sampler.scrape = [url]
        sampler.sample()
        sampler.points["SyncOrder"].clear()
        jobs.labels("SyncOrder", "succeeded").inc(30)
        jobs.labels("SyncOrder", "morgued").inc(6)
        jobs.labels("SyncOrder", "retried").inc(50)  # not finished: ignored
        started = sampler._last[url][0]
        sampler.sample()
        ((t, rate),) = sampler.points["SyncOrder"]
        assert rate == pytest.approx(36 * 60 / (t - started), rel=0.01)
        assert sampler.snapshot()["throughput"]["SendReceipt"][-1][1] == 0.0
    finally:
        metrics.shutdown()
        metrics.server_close()
        broker.close()


# -- the fleet ----------------------------------------------------------------------
def write_fleet(filled: shardq.App, now: float) -> None:
    """Node a holds SyncOrder 0-1 (lag 42 s on 0) and runs 2.5 jobs/s; node b, killed
    75 s ago and marked gone by a, held SyncOrder 2-3; node c went 20 minutes ago."""
    store = filled.store
    heartbeat(
        store,
        "node-a",
        now - 4,
        ("SyncOrder:0", "SyncOrder:1"),
        lags={"SyncOrder:0": 42.0, "SyncOrder:1": 0.0},
        jobs_per_second=2.5,
        concurrency=32,
        slots_in_use=12,
        done=640,
        retried=7,
        failed=3,
    )
    heartbeat(store, "node-b", now - 75, (), gone="lease expired", gone_at=now - 75)
    store.put(  # b's report listed what it held
        "node/node-b",
        {**store.get("node/node-b").value, "held": ["SyncOrder:2", "SyncOrder:3"]},  # type: ignore[union-attr]
        version=store.get("node/node-b").version,  # type: ignore[union-attr]
    )
    heartbeat(store, "node-c", now - 1300, (), gone="lease expired", gone_at=now - 1200)


def test_nodes_api_answers_from_the_background_sample(filled: shardq.App) -> None:
    # given a dashboard sampling once an hour (the fleet too), started before any node
    # reported
    srv = make_server(filled, "127.0.0.1", 0, refresh=3600)
    srv.sampler.fleet_refresh = 3600
    srv.start()
    try:
        status, nodes = call(srv, "GET", "/api/v1/nodes")
        assert status == 200 and nodes["nodes"] == [] and nodes["gone"] == []
        # when nodes report, then requests still answer the sample, not the broker
        now = time.time()
        write_fleet(filled, now)
        assert call(srv, "GET", "/api/v1/nodes")[1] == nodes
        # when the next sample is taken, then it shows the live node and the gone ones
        srv.sampler.sample()
        status, nodes = call(srv, "GET", "/api/v1/nodes")
        assert status == 200
        assert set(nodes) == {"time", "nodes", "gone", "unserved", "no_live_node", "damaged"}
        assert {"SyncOrder:2", "SyncOrder:3"} <= set(nodes["unserved"])
        assert not {"SyncOrder:0", "SyncOrder:1"} & set(nodes["unserved"])
        assert nodes["time"] == call(srv, "GET", "/api/v1/stats")[1]["time"]
        assert [n["node"] for n in nodes["nodes"]] == ["node-a"]
        (a,) = nodes["nodes"]
        assert a["held"] == ["SyncOrder:0", "SyncOrder:1"] and a["jobs_per_second"] == 2.5
        assert (a["slots_in_use"], a["concurrency"]) == (12, 32)
        assert (a["done"], a["retried"], a["failed"]) == (640, 7, 3)
        assert [(g["node"], g["reason"]) for g in nodes["gone"]] == [
            ("node-b", "lease expired"),
            ("node-c", "lease expired"),
        ]
        assert nodes["gone"][0]["unserved"] == ["SyncOrder:2", "SyncOrder:3"]
        # and it is what `shardq nodes --json` prints for the same document
        assert current_fleet(filled, nodes["time"]).to_json() == nodes
    finally:
        srv.stop()


def test_the_fleet_is_read_every_second_between_two_full_samples(filled: shardq.App) -> None:
    # given a sampler whose full sample is an hour apart, on a clock the test moves, that
    # sampled before any node reported
    clock = ManualClock()
    sampler = Sampler(filled, refresh=3600, clock=clock)
    sampler.step()
    assert sampler.nodes()["nodes"] == []
    stats_time = sampler.snapshot()["time"]
    # when nodes report and a second passes
    write_fleet(filled, time.time())
    clock.advance(1.0)
    # then the next step, a second later, reads them well before the next full sample
    assert sampler.step() == 1.0
    nodes = sampler.nodes()
    assert [n["node"] for n in nodes["nodes"]] == ["node-a"]
    assert [g["node"] for g in nodes["gone"]] == ["node-b", "node-c"]
    # and the stats were not sampled again (only the fleet document was read)
    assert sampler.snapshot()["time"] == stats_time


def test_a_fleet_read_that_fails_keeps_the_last_good_fleet(
    filled: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a sample that saw a live node
    write_fleet(filled, time.time())
    sampler = Sampler(filled, refresh=5)
    sampler.sample()
    before = sampler.nodes()

    # when the fleet document cannot be read between two samples
    def broken(store: object) -> None:
        raise BrokerError("the broker is down")

    monkeypatch.setattr("shardq.ops.stats.read_fleet", broken)
    with capture_logs() as logs:
        sampler.sample_fleet()
        sampler.sample_fleet()
    # then the last good fleet is still served and the failure is logged once
    assert sampler.nodes() == before
    assert [e["event"] for e in logs] == ["dashboard.fleet_sample_failed"]
    assert "the broker is down" in logs[0]["error"]


def test_stats_name_each_shard_owner_and_on_sqs_take_lag_and_total_from_reports(
    filled: shardq.App, kind: str
) -> None:
    # given two nodes that reported, one since silent, and one that stopped
    now = time.time()
    write_fleet(filled, now)
    sampler = Sampler(filled, refresh=5)
    # when the dashboard samples twice
    sampler.sample()
    sampler.sample()
    stats = sampler.snapshot()
    # then every broker names the live owner of each shard
    shards = stats["by_worker"]["SyncOrder"]["shards"]
    assert [s["owner"] for s in shards] == ["node-a", "node-a", None, None]
    assert stats["by_worker"]["SendReceipt"]["shards"][0]["owner"] is None
    if kind == "sqs":
        # and on SQS the lags are the owner's reports instead of unknown
        assert stats["lag_source"] == "reports"
        assert [s["lag"] for s in shards] == [42.0, 0.0, None, None]
        assert stats["by_worker"]["SyncOrder"]["lag"] == 42.0
        # and the total throughput is the live node's report, saying what it leaves out
        assert stats["throughput_source"] == "reports" and stats["throughput"] is None
        assert [p[1] for p in stats["throughput_total"]] == [150.0, 150.0]
        assert stats["throughput_excludes"] == [
            {"node": "node-b", "since": pytest.approx(now - 75), "reason": "lease expired"},
            {"node": "node-c", "since": pytest.approx(now - 1200), "reason": "lease expired"},
        ]
        assert "--scrape" in stats["throughput_note"]
    else:
        # and the embedded broker keeps its exact lags and counts
        assert stats["lag_source"] == "broker" and stats["throughput_source"] == "broker"
        assert shards[0]["lag"] != 42.0 and stats["throughput_excludes"] == []
        assert stats["throughput_total"][-1][1] == 0.0


def test_a_store_it_cannot_read_leaves_the_counts_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a job waiting, and a state store whose fleet items cannot be read
    app.configure(Config(queue_prefix="nostore-"), broker=MemoryBroker())
    SyncOrder.publish("o1", {"n": 0})

    query = app.store.query

    def unreachable(prefix: str, **kwargs: Any) -> Any:  # the fleet's items only
        if prefix.startswith(("node/", "shard/")):
            raise StoreError("reading the state store failed: AccessDeniedException")
        return query(prefix, **kwargs)

    monkeypatch.setattr(app.store, "query", unreachable)
    srv = make_server(app, "127.0.0.1", 0, refresh=3600).start()
    try:
        # when the dashboard samples, then the stats still come, saying what is missing
        status, stats = call(srv, "GET", "/api/v1/stats")
        assert status == 200 and stats["total"]["length"] == 1
        assert "AccessDeniedException" in stats["fleet_error"]
        assert all(s["owner"] is None for s in stats["by_worker"]["SyncOrder"]["shards"])
        # and the nodes answer why they cannot be listed
        status, nodes = call(srv, "GET", "/api/v1/nodes")
        assert status == 503 and "cannot read the fleet items" in nodes["error"]
        assert "AccessDeniedException" in nodes["error"]
    finally:
        srv.stop()
        app.broker.close()


@pytest.mark.sqs
def test_with_scrape_a_node_that_stops_answering_is_left_out_and_named(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    def metrics_server() -> tuple[ThreadingHTTPServer, Any, str]:
        registry = CollectorRegistry()
        jobs = Counter(
            "shardq_jobs_total", "Jobs", ["worker", "outcome", "node"], registry=registry
        )

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, jobs, f"http://127.0.0.1:{server.server_address[1]}/metrics"

    # given two nodes' metrics scraped by the dashboard on SQS
    (one, jobs_one, url_one), (two, jobs_two, url_two) = metrics_server(), metrics_server()
    broker = make_broker("sqs", tmp_path, request)
    try:
        app.configure(Config(queue_prefix=f"s{time.monotonic_ns() % 10**9}-"), broker=broker)
        app.store.ensure_table()  # DynamoDB's, as `shardq queues ensure` makes it
        sampler = Sampler(app, refresh=5, scrape=[url_one, url_two])
        jobs_two.labels("SyncOrder", "succeeded", "two").inc(25)
        sampler.sample()
        # when node two is killed while node one keeps working
        two.shutdown()
        two.server_close()
        jobs_one.labels("SyncOrder", "succeeded", "one").inc(60)
        started = sampler._last[url_one][0]
        sampler.sample()
        # then the figures are node one's, not 0, and node two is named as left out
        snapshot = sampler.snapshot()
        ((t, rate),) = sampler.points["SyncOrder"]
        assert rate == pytest.approx(60 * 60 / (t - started), rel=0.01) and rate > 0
        assert snapshot["throughput_total"] == [[t, rate]]
        (excluded,) = snapshot["throughput_excludes"]
        assert excluded["node"] == url_two and excluded["reason"] == "not answering"
        assert excluded["since"] == t
    finally:
        one.shutdown()
        one.server_close()
        broker.close()


def test_morgue_list_requeue_and_purge(server: DashboardServer) -> None:
    filled = server.app
    status, doc = call(server, "GET", "/api/v1/morgue/SyncOrder")
    assert status == 200 and (doc["next"], doc["size"]) == (None, 3)
    jobs = doc["jobs"]
    assert sorted((j["entity_id"], j["payload"]["n"]) for j in jobs) == [
        ("o1", 0),
        ("o1", 1),
        ("o2", 0),
    ]
    first = next(j for j in jobs if j["entity_id"] == "o1" and j["payload"]["n"] == 0)
    assert first["reason"] == "permanent_error" and first["error_type"] == "PermanentError"
    assert first["error_message"] == "card declined" and first["attempts"] == 1
    assert "Traceback" in first["traceback"] and first["source_queue"].endswith(".fifo")
    assert [
        j["entity_id"] for j in call(server, "GET", "/api/v1/morgue/SyncOrder?entity=o2")[1]["jobs"]
    ] == ["o2"]
    assert len(call(server, "GET", "/api/v1/morgue/SyncOrder?limit=1")[1]["jobs"]) == 1
    assert call(server, "GET", "/api/v1/morgue/SendReceipt")[1]["jobs"] == []

    before = shard_length(filled, "SyncOrder", "o1")
    body = {"message_ids": [first["message_id"]]}
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/requeue", body) == (200, {"requeued": 1})
    assert shard_length(filled, "SyncOrder", "o1") == before + 1
    assert Morgue(filled, "SyncOrder").size() == 2

    assert call(server, "POST", "/api/v1/morgue/SyncOrder/purge", {"entity": "o2"}) == (
        200,
        {"purged": 1},
    )
    listed = call(server, "GET", "/api/v1/morgue/SyncOrder")[1]["jobs"]
    assert [j["entity_id"] for j in listed] == ["o1"]
    everything = {"all": True}
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/requeue", everything) == (
        200,
        {"requeued": 1},
    )
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/purge", everything) == (
        200,
        {"purged": 0},
    )
    assert Morgue(filled, "SyncOrder").size() == 0
    assert shard_length(filled, "SyncOrder", "o1") == before + 2


def test_a_requeue_or_purge_names_the_ids_that_match_nothing_and_the_jobs_it_left(
    server: DashboardServer,
) -> None:
    # given o1's first dead job damaged (its body altered), and an id no dead job has
    filled = server.app
    jobs = call(server, "GET", "/api/v1/morgue/SyncOrder?entity=o1")[1]["jobs"]
    first, second = (j["message_id"] for j in jobs)
    record = next(r for r in Morgue(filled, "SyncOrder").list_jobs() if r.message_id == first)
    item = filled.store.get(record.key)
    assert item is not None
    filled.store.put(record.key, {**item.value, "body": "{}"}, version=item.version)
    # when both of o1's and the unknown id are requeued
    body = {"message_ids": [first, second, "no-such-id"]}
    status, doc = call(server, "POST", "/api/v1/morgue/SyncOrder/requeue", body)
    # then the answer says none was requeued, which stayed and why, and the unknown id
    assert status == 200 and doc["requeued"] == 0 and doc["missing"] == ["no-such-id"]
    left = {j["message_id"]: j for j in doc["not_requeued"]}
    assert set(left) == {first, second} and left[first]["entity_id"] == "o1"
    assert "earlier dead job of its entity" in left[second]["why"]
    assert Morgue(filled, "SyncOrder").size() == 3
    # and a purge of an unknown id says it purged nothing and names it
    unknown = {"message_ids": ["no-such-id"]}
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/purge", unknown) == (
        200,
        {"purged": 0, "missing": ["no-such-id"]},
    )


# On DynamoDB (the SQS apps' store) the morgue's pages, searches and bulk actions are
# test_morgue_ops' (cursor pages, filters, requeue and purge by filter, [sqs]); the
# dashboard serves them the same way on any store, as test_morgue_list_requeue_and_purge
# above shows on both.
@pytest.mark.parametrize("kind", ["sqlite"])
def test_the_morgue_pages_through_every_dead_job_with_search_and_bulk_actions(
    server: DashboardServer,
) -> None:
    # given 250 more dead SyncOrder jobs: 120 of KeyError, the rest of 13 other entities
    records = []
    for i in range(250):
        entity = "big" if i % 2 else f"x{i % 13}"
        body = envelope.encode(envelope.Envelope("SyncOrder", entity, {"n": 100 + i}))
        message = Message("q.fifo", f"k{i}", "", body, entity, 1, 1.0, str(i))
        error = KeyError("gone") if i < 120 else RuntimeError("no")
        records.append(morgue.record_for(message, morgue.REASON_MAX_RETRIES, error, 3))
    morgue.bury(server.app.store, "SyncOrder", records)
    # when the dashboard pages through the morgue 100 at a time
    seen: list[str] = []
    path = "/api/v1/morgue/SyncOrder?limit=100"
    while path:
        status, doc = call(server, "GET", path)
        assert status == 200 and doc["size"] == 253
        seen += [j["message_id"] for j in doc["jobs"]]
        cursor = doc["next"]
        path = (
            f"/api/v1/morgue/SyncOrder?limit=100&after={urllib.parse.quote(cursor)}"
            if cursor
            else ""
        )
    # then it reaches every dead job once, and a search narrows the pages
    assert len(seen) == len(set(seen)) == 253
    status, doc = call(server, "GET", "/api/v1/morgue/SyncOrder?error_type=KeyError&limit=1000")
    assert len(doc["jobs"]) == 120 and doc["next"] is None
    status, doc = call(server, "GET", "/api/v1/morgue/SyncOrder?entity=big&since=1h&limit=1000")
    assert [j["payload"]["n"] for j in doc["jobs"]] == [100 + i for i in range(1, 250, 2)]
    assert call(server, "GET", "/api/v1/morgue/SyncOrder?since=sometime")[0] == 400
    # and a bulk requeue of a search sends those jobs and leaves the rest
    body = {"entity": "big", "error_type": "KeyError"}
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/requeue", body) == (200, {"requeued": 60})
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/purge", {"error_type": "KeyError"}) == (
        200,
        {"purged": 60},
    )
    assert Morgue(server.app, "SyncOrder").size() == 253 - 120


# HTTP handling (refusals, tokens, origins, the page itself) is the same on any broker:
# SQS would repeat it behind a slower fixture; its morgue actions are
# test_morgue_list_requeue_and_purge[sqs].
HTTP_ONLY = pytest.mark.parametrize("kind", ["sqlite"])


@HTTP_ONLY
def test_errors_are_json(server: DashboardServer) -> None:
    status, doc = call(server, "GET", "/api/v1/morgue/NoSuchWorker")
    assert status == 404 and "NoSuchWorker" in doc["error"]
    status, doc = call(server, "POST", "/api/v1/morgue/NoSuchWorker/requeue", {})
    assert status == 404 and "NoSuchWorker" in doc["error"]
    for body in [b"{not json", b"[1, 2]", {"message_ids": "abc"}, {"entity": 42}]:
        status, doc = call(server, "POST", "/api/v1/morgue/SyncOrder/purge", body)
        assert status == 400 and doc["error"], body
    assert call(server, "GET", "/api/v1/morgue/SyncOrder?limit=lots")[0] == 400
    assert call(server, "GET", "/api/v1/nothing")[0] == 404
    assert call(server, "GET", "/api/v1/morgue/SyncOrder/requeue")[0] == 405
    assert Morgue(server.app, "SyncOrder").size() == 3  # nothing was touched


def raw_post(srv: DashboardServer, path: str, head: str, body: bytes) -> tuple[int, Any]:
    """POST bytes as given (no Content-Length added), half-close, read the answer."""
    with socket.create_connection(("127.0.0.1", srv.server_port), timeout=30) as sock:
        request = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode()
        sock.sendall(request + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    headers, _, content = answer.partition(b"\r\n\r\n")
    return int(headers.split()[1]), json.loads(content)


@HTTP_ONLY
def test_a_typo_an_empty_body_or_a_contradiction_selects_nothing(server: DashboardServer) -> None:
    # given a morgue with 3 dead SyncOrder jobs
    morgue = Morgue(server.app, "SyncOrder")
    for action in ("requeue", "purge"):
        path = f"/api/v1/morgue/SyncOrder/{action}"
        for body in [
            {"entitiy": "o1"},  # a typo must not mean "all"
            {"entity": "o1", "messageids": ["x"]},
            {},
            b"",
            {"all": False},
            {"all": "yes"},
            {"all": True, "entity": "o1"},
            {"message_ids": ["a", ""]},
        ]:
            # when the body does not say exactly what to act on
            status, doc = call(server, "POST", path, body)
            # then it is refused with a reason, and nothing is touched
            assert status == 400, (action, body)
            assert doc.get("error"), (action, body)
        status, doc = call(server, "POST", path, {"entitiy": "o1"})
        assert "'entitiy'" in doc["error"] and '"all": true' in doc["error"]
        assert morgue.size() == 3
    # and "all" is said explicitly
    assert call(server, "POST", "/api/v1/morgue/SyncOrder/purge", {"all": True}) == (
        200,
        {"purged": 3},
    )
    assert morgue.size() == 0


@HTTP_ONLY
def test_bodies_without_a_length_are_refused_and_change_nothing(server: DashboardServer) -> None:
    path = "/api/v1/morgue/SyncOrder/purge"
    # given a chunked body (no Content-Length)
    chunked = b'{"all": true}'
    status, doc = raw_post(
        server,
        path,
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunked), chunked),
    )
    # then it is refused as needing a length, nothing purged
    assert status == 411 and "Content-Length" in doc["error"]
    # and so is a body with no length at all, or shorter than its length
    assert raw_post(server, path, "", b'{"all": true}')[0] == 411
    status, doc = raw_post(server, path, "Content-Length: 40\r\n", b'{"all": true}')
    assert status == 400 and "shorter" in doc["error"]
    assert Morgue(server.app, "SyncOrder").size() == 3


def test_forged_morgue_records_show_as_unreadable_and_the_morgue_keeps_working(
    server: DashboardServer,
) -> None:
    # given records written straight into an old morgue queue by someone else (moved
    # into the store by `queues ensure`), and an item of the wrong shape in the store
    filled = server.app
    queue = filled.morgue_queue("SyncOrder")
    wrong_types = {
        "kind": "shardq.morgue",
        "v": 1,
        "body": 42,
        "entity_id": ["x"],
        "reason": None,
        "error_type": {},
        "error_message": 7,
        "traceback": [],
        "attempts": "many",
        "failed_at": "yesterday",
        "source_queue": 1,
        "message_id": {"a": 1},
    }
    not_a_number = {**wrong_types, "body": "{}", "entity_id": "f2", "reason": "max_retries"}
    not_a_number.update(error_type="E", error_message="m", traceback="", attempts=1)
    not_a_number.update(source_queue="q", message_id="m-2")
    bodies = [
        json.dumps(wrong_types),
        json.dumps(not_a_number).replace('"yesterday"', "NaN"),
        '{"kind": "shardq.morgue", "v": 1, "body": ' + "[" * 50_000 + "]" * 50_000 + "}",
    ]
    filled.ensure_queue(queue, "SyncOrder")
    filled.broker.send_batch(
        queue, [SendEntry(str(i), b, f"forged-{i}", f"forged-{i}") for i, b in enumerate(bodies)]
    )
    assert move_queue_morgue(filled, "SyncOrder") == 3
    stamp = "0" * 20 + "abcdef"
    filled.store.put(f"morgue/SyncOrder/e/f3/{stamp}", wrong_types, version=None)
    filled.store.put(f"morgue/SyncOrder/t/{stamp}/f3", wrong_types, version=None)
    # when the dashboard lists the morgue
    status, doc = call(server, "GET", "/api/v1/morgue/SyncOrder")
    # then every record shows, the forged ones as unreadable with their raw text
    assert status == 200, doc
    jobs = doc["jobs"]
    assert len(jobs) == 7
    forged = [j for j in jobs if j["unreadable"]]
    assert len(forged) == 4
    for job in forged:
        assert isinstance(job["message_id"], str) and isinstance(job["entity_id"], str)
        assert isinstance(job["raw"], str) and job["payload"] is None
        assert isinstance(job["attempts"], int) and isinstance(job["failed_at"], float)
    assert not any(j["unreadable"] for j in jobs if j["entity_id"] in ("o1", "o2"))
    # and the forged ones can be deleted one by one, the rest all at once
    one = forged[0]["message_id"]
    path = "/api/v1/morgue/SyncOrder/purge"
    assert call(server, "POST", path, {"message_ids": [one]}) == (200, {"purged": 1})
    assert call(server, "POST", path, {"all": True}) == (200, {"purged": 6})
    assert Morgue(filled, "SyncOrder").size() == 0


@HTTP_ONLY
def test_a_deeply_nested_body_is_a_bad_request(server: DashboardServer) -> None:
    deep = b'{"message_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, doc = call(server, "POST", "/api/v1/morgue/SyncOrder/purge", deep)
    assert status == 400 and "nested" in doc["error"]
    assert Morgue(server.app, "SyncOrder").size() == 3


@HTTP_ONLY
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"since": NaN}', "NaN is not a JSON number"),
        (b'{"until": Infinity}', "Infinity is not a JSON number"),
        (b'{"message_ids": ["m"], "since": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"until": 1e999}', "1e999 is too large for a JSON number"),
    ],
)
def test_a_body_with_nan_or_infinity_is_not_json(
    server: DashboardServer, body: bytes, problem: str
) -> None:
    # when a requeue's body holds NaN, Infinity or a number no float can hold
    status, doc = call(server, "POST", "/api/v1/morgue/SyncOrder/requeue", body)
    # then it is refused as not JSON, naming the problem, and nothing is touched
    assert status == 400
    assert doc["error"].startswith("the request body is not valid JSON")
    assert problem in doc["error"]
    assert Morgue(server.app, "SyncOrder").size() == 3


@HTTP_ONLY
def test_without_a_token_cross_origin_and_foreign_host_requests_are_refused(
    server: DashboardServer,
) -> None:
    purge = "/api/v1/morgue/SyncOrder/purge"
    status, doc = call(server, "POST", purge, {}, Origin="http://evil.example")
    assert status == 403 and "cross-origin" in doc["error"]
    # a DNS-rebinding page reaches 127.0.0.1 under its own name
    status, _ = call(server, "GET", "/api/v1/morgue/SyncOrder", Host="evil.example")
    assert status == 403
    assert Morgue(server.app, "SyncOrder").size() == 3
    origin = server.url.rstrip("/")
    assert call(server, "POST", purge, {"entity": "o2"}, Origin=origin) == (200, {"purged": 1})


@HTTP_ONLY
def test_with_a_token_actions_need_it(filled: shardq.App) -> None:
    srv = make_server(filled, "127.0.0.1", 0, token=TOKEN, refresh=0.2).start()
    try:
        purge = "/api/v1/morgue/SyncOrder/purge"
        assert call(srv, "POST", purge, {})[0] == 401
        assert call(srv, "POST", purge, {}, Authorization="Bearer wrong")[0] == 401
        assert call(srv, "POST", purge, {}, Authorization=TOKEN)[0] == 401
        assert Morgue(filled, "SyncOrder").size() == 3
        assert call(srv, "GET", "/api/v1/stats")[0] == 200  # stats need no token
        assert call(srv, "GET", "/api/v1/nodes")[0] == 200  # nor do nodes
        # dead jobs' payloads may be sensitive: listing them needs the token too
        assert call(srv, "GET", "/api/v1/morgue/SyncOrder")[0] == 401
        listed = call(srv, "GET", "/api/v1/morgue/SyncOrder", Authorization=f"Bearer {TOKEN}")
        assert listed[0] == 200 and len(listed[1]["jobs"]) == 3
        ok = call(srv, "POST", purge, {"entity": "o2"}, Authorization=f"Bearer {TOKEN}")
        assert ok == (200, {"purged": 1})
    finally:
        srv.stop()


@HTTP_ONLY
def test_refuses_to_serve_beyond_loopback_without_a_token(filled: shardq.App) -> None:
    from shardq.ops.dashboard import serve

    for host in ["0.0.0.0", "", "::"]:
        with pytest.raises(ConfigError, match="without a token"):
            make_server(filled, host, 0)
    with pytest.raises(ConfigError, match="without a token"):
        serve(filled, host="0.0.0.0", port=0)  # refuses instead of blocking
    make_server(filled, "0.0.0.0", 0, token=TOKEN).stop()
    make_server(filled, "localhost", 0).stop()


@HTTP_ONLY
def test_a_port_or_refresh_out_of_range_is_a_config_error(filled: shardq.App) -> None:
    # given `shardq dashboard --port 99999`, `--port -1` or `--refresh nan` / `inf`
    # then each is refused naming it (not an OverflowError traceback, nor a dashboard
    # whose samples never refresh)
    for port in (99999, -1):
        with pytest.raises(ConfigError, match=f"cannot serve the dashboard on 127.0.0.1:{port}"):
            make_server(filled, "127.0.0.1", port)
    for refresh in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="refresh must be a positive number"):
            make_server(filled, "127.0.0.1", 0, refresh=refresh)


@HTTP_ONLY
def test_a_refresh_too_short_or_too_long_is_refused_naming_the_option_and_range(
    filled: shardq.App,
) -> None:
    # given `shardq dashboard --refresh 1e-9` (a busy loop) or `--refresh 1e9` (never)
    for refresh in (1e-9, 0.09, 3601.0, 1e9):
        # then each is refused naming the option and the allowed range
        with pytest.raises(ConfigError, match=r"--refresh must be .* from 0\.1 to 3600 "):
            make_server(filled, "127.0.0.1", 0, refresh=refresh)
    # and the bounds themselves are accepted
    for refresh in (0.1, 3600.0):
        make_server(filled, "127.0.0.1", 0, refresh=refresh).stop()


# -- the page in a real browser -----------------------------------------------------
@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (starting one takes a second or two)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing:
        reason = (
            f"browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must run it")
        pytest.skip(reason)
    profile = tempfile.mkdtemp(prefix="shardq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The session's Chromium in a tab of its own (fresh session storage, no emulated
    width), its window 1400 x 1000 px; afterwards on a blank page, so that the test's
    page no longer polls a dashboard during later tests."""
    from selenium.common.exceptions import NoAlertPresentException

    used = chromium.current_window_handle
    chromium.switch_to.new_window("tab")
    fresh = chromium.current_window_handle
    chromium.switch_to.window(used)
    chromium.close()
    chromium.switch_to.window(fresh)
    chromium.set_window_size(1400, 1000)
    yield chromium
    with contextlib.suppress(NoAlertPresentException):
        chromium.switch_to.alert.dismiss()  # a dialog the test left open
    chromium.get("about:blank")


def text_of(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


@pytest.mark.parametrize("kind", ["sqlite"])
def test_page_shows_the_queues_and_requeues_a_dead_job(browser: Any, filled: shardq.App) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    srv = make_server(filled, "127.0.0.1", 0, token=TOKEN, refresh=0.5).start()
    try:
        wait = WebDriverWait(browser, 60)
        browser.get(srv.url)
        sync = '[data-worker="SyncOrder"]'
        wait.until(lambda d: text_of(d, f'{sync} [data-k="length"]') == "5")
        assert text_of(browser, f'{sync} [data-k="morgue_length"]') == "3"
        assert text_of(browser, '[data-worker="SendReceipt"] [data-k="length"]') == "2"
        assert text_of(browser, "#t-length") == "7"
        assert text_of(browser, "#t-morgue_length") == "3"
        assert text_of(browser, "#t-done") == "7"
        assert "4 shards" in text_of(browser, f"{sync} .meta")

        browser.find_element(By.CSS_SELECTOR, f"{sync} details.shards summary").click()
        rows = browser.execute_script(  # read at once: each stats poll redraws the rows
            "return [...document.querySelectorAll(arguments[0])].map(r => r.innerText)",
            f"{sync} details.shards tbody tr",
        )
        assert len(rows) == 4 and sum(int(r.split()[1]) for r in rows) == 5

        # SyncOrder (the biggest morgue) is chosen; the button gets the click itself: the
        # shards just opened above it and each poll redraws their rows, so a click aimed
        # at where the button was a moment ago may land beside it
        browser.execute_script("arguments[0].click()", browser.find_element(By.ID, "m-show"))
        wait.until(ec.alert_is_present())  # 401: dead jobs need the token; the page asks
        prompt = browser.switch_to.alert
        prompt.send_keys(TOKEN)
        prompt.accept()
        dead = "#m-table tr[data-message-id]"
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 3)
        row = next(
            r
            for r in browser.find_elements(By.CSS_SELECTOR, dead)
            if r.get_attribute("data-entity") == "o2"
        )
        assert "unknown sku" in row.text and "permanent error" in row.text
        assert '"n":0' in row.text.replace(" ", "")
        message_id = row.get_attribute("data-message-id")
        before = shard_length(filled, "SyncOrder", "o2")

        row.find_element(By.CSS_SELECTOR, 'button[data-action="requeue"]').click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 2)
        assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-message-id="{message_id}"]')
        assert "Requeued" in text_of(browser, "#toast")
        assert shard_length(filled, "SyncOrder", "o2") == before + 1
        morgue = Morgue(filled, "SyncOrder")
        assert morgue.size() == 2 and message_id not in {r.message_id for r in morgue.list_jobs()}
        wait.until(lambda d: text_of(d, f'{sync} [data-k="length"]') == "6")
    finally:
        srv.stop()


LAYOUT_PROBLEMS = """
const problems = [], page = document.documentElement, width = page.clientWidth;
if (page.scrollWidth > width) problems.push(`the page is ${page.scrollWidth} px wide in ${width}`);
for (const box of document.querySelectorAll(".mtable, .card")) {
  if (box.scrollWidth > box.clientWidth + 1) problems.push(`${box.className} overflows`);
}
for (const button of document.querySelectorAll("button")) {
  const r = button.getBoundingClientRect();
  if (r.width && (r.left < 0 || r.right > width)) {
    problems.push(`button "${button.textContent.trim()}" spans ${r.left}..${r.right} px`);
  }
}
return problems;
"""


def set_width(driver: Any, width: int, height: int = 1000) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


@pytest.mark.parametrize("kind", ["sqlite"])
def test_page_fits_1400_and_420_px_and_acts_on_the_dead_jobs_shown(
    browser: Any, filled: shardq.App
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # given a dead job with the longest entity id SQS allows and a long payload and error
    long_id = ("tenant-acme/eu-west-1/order-" + "9" * 200)[:128]
    SyncOrder.publish(long_id, {"note": "y" * 3000, "error": "E" * 600})
    run_until_empty()
    srv = make_server(filled, "127.0.0.1", 0, refresh=0.5).start()
    try:
        # rows read while the page redraws them go stale: the wait reads them again
        wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])
        browser.get(srv.url)
        wait.until(
            lambda d: text_of(d, '[data-worker="SyncOrder"] [data-k="morgue_length"]') == "4"
        )
        browser.find_element(By.ID, "m-show").click()
        dead = "#m-table tr[data-message-id]"
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 4)
        # then at 1400 and at 420 px (and between) nothing overflows, every button on screen
        for width in (1400, 1101, 1100, 420):
            set_width(browser, width)
            assert browser.execute_script("return window.innerWidth") == width
            assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
        set_width(browser, 1400)

        # when an entity is chosen and the jobs shown of it are requeued
        before = shard_length(filled, "SyncOrder", "o1")
        o1 = next(
            r
            for r in browser.find_elements(By.CSS_SELECTOR, dead)
            if r.get_attribute("data-entity") == "o1"
        )
        o1.find_element(By.CSS_SELECTOR, "button.entity").click()

        def filtered(d: Any) -> bool:
            shown = [r.get_attribute("data-entity") for r in d.find_elements(By.CSS_SELECTOR, dead)]
            if shown == ["o1", "o1"]:
                return True
            if "o1" in shown:  # the click met a redraw of the rows: click o1's entity again
                row = next(
                    r
                    for r in d.find_elements(By.CSS_SELECTOR, dead)
                    if r.get_attribute("data-entity") == "o1"
                )
                row.find_element(By.CSS_SELECTOR, "button.entity").click()
            return False

        wait.until(filtered)
        browser.find_element(By.ID, "m-requeue-shown").click()
        wait.until(ec.alert_is_present())
        confirm = browser.switch_to.alert
        # then the confirmation names the count, and only those two are requeued
        assert "2 dead SyncOrder jobs shown of entity o1" in confirm.text
        confirm.accept()
        wait.until(lambda d: "Requeued 2 of 2" in text_of(d, "#toast"))
        wait.until(lambda d: "No dead SyncOrder jobs" in text_of(d, "#m-table"))
        assert shard_length(filled, "SyncOrder", "o1") == before + 2
        morgue = Morgue(filled, "SyncOrder")
        assert sorted(r.entity_id for r in morgue.list_jobs()) == sorted([long_id, "o2"])

        # when all shown are deleted, a dismissed confirmation first changes nothing
        browser.find_element(By.ID, "m-entity").clear()
        browser.find_element(By.ID, "m-show").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 2)
        browser.find_element(By.ID, "m-purge-shown").click()
        wait.until(ec.alert_is_present())
        assert "Delete the 2 dead SyncOrder jobs shown for good?" in browser.switch_to.alert.text
        browser.switch_to.alert.dismiss()
        assert morgue.size() == 2
        browser.find_element(By.ID, "m-purge-shown").click()
        wait.until(ec.alert_is_present())
        browser.switch_to.alert.accept()
        wait.until(lambda d: "No dead SyncOrder jobs" in text_of(d, "#m-table"))
        assert morgue.size() == 0
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["sqlite"])  # the same page and API on any store: see above
def test_page_pages_through_the_morgue_and_acts_on_all_that_match_a_search(
    browser: Any, filled: shardq.App
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # given 250 more dead SyncOrder jobs (253 in all), 125 of them of KeyError
    records = []
    for i in range(250):
        body = envelope.encode(envelope.Envelope("SyncOrder", f"p{i % 9}", {"n": i}))
        message = Message("q.fifo", f"k{i}", "", body, f"p{i % 9}", 1, 1.0, str(i))
        error = KeyError("gone") if i % 2 else RuntimeError("no")
        records.append(morgue.record_for(message, morgue.REASON_MAX_RETRIES, error, 3))
    morgue.bury(filled.store, "SyncOrder", records)
    srv = make_server(filled, "127.0.0.1", 0, refresh=0.5).start()
    try:
        wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])
        set_width(browser, 1400)
        browser.get(srv.url)
        wait.until(lambda d: d.find_element(By.ID, "m-worker").get_attribute("value"))
        browser.find_element(By.ID, "m-show").click()
        dead = "#m-table tr[data-message-id]"
        # when the first page shows, then the next
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 200)
        assert "Page 1 · more match" in text_of(browser, "#m-page")
        browser.find_element(By.ID, "m-next").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 53)
        # then the second page holds the rest, and the first comes back
        assert "Page 2 · the last" in text_of(browser, "#m-page")
        browser.find_element(By.ID, "m-prev").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 200)
        for width in (1400, 420):
            set_width(browser, width)
            assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
        set_width(browser, 1400)
        # when the KeyError ones are searched and all of them deleted
        browser.find_element(By.ID, "m-error-type").send_keys("KeyError")
        browser.find_element(By.ID, "m-show").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, dead)) == 125)
        browser.find_element(By.ID, "m-purge-matching").click()
        wait.until(ec.alert_is_present())
        confirm = browser.switch_to.alert
        assert "every dead SyncOrder job matching error type KeyError" in confirm.text
        confirm.accept()
        # then exactly those are gone
        wait.until(lambda d: "Deleted 125 dead SyncOrder jobs" in text_of(d, "#toast"))
        assert Morgue(filled, "SyncOrder").size() == 253 - 125
    finally:
        srv.stop()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def test_page_shows_the_nodes_and_says_when_one_went_away(
    browser: Any, filled: shardq.App, kind: str
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given node-a live, node-b marked gone 75 s ago, node-c gone 20 minutes ago
    write_fleet(filled, time.time())
    srv = make_server(filled, "127.0.0.1", 0, refresh=0.5).start()
    try:
        wait = WebDriverWait(browser, 60, ignored_exceptions=[StaleElementReferenceException])

        def shown(css: str) -> str:
            """The element's text, read again if a redraw (every 0.5 s) replaced it."""
            return str(wait.until(lambda d: text_of(d, css)))

        set_width(browser, 1400)
        browser.get(srv.url)
        # then the live node is listed with what it reported (once the page drew both
        # the nodes and the banner: two answers, which a loaded machine may space out)
        wait.until(
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, '#nodes tr[data-node="node-a"]')
                and len(text_of(d, "#fleet-banner").splitlines()) == 2
            )
        )
        live = shown('#nodes tr[data-node="node-a"]')
        for part in ("node-a", "ip-10-0-1-6", "4106", "SyncOrder \u00d72", "2.5", "42.0 s", "live"):
            assert part in live, (part, live)
        # with its execution slots in use out of its concurrency, and its jobs done
        assert "12/32" in live and "640" in live, live
        # and the gone ones are shown as such, with when and why
        gone = browser.execute_script(
            "return [...document.querySelectorAll('#nodes tr.gone')].map(r => r.innerText)"
        )
        assert [g.split()[0] for g in gone] == ["node-b", "node-c"]
        assert re.search(r"gone \d\d:\d\d:\d\d · lease expired", gone[0]), gone[0]
        assert "lease expired" in gone[1]
        assert "1 live · 2 gone in the last hour" in shown("#nodes-title")
        # and a banner says which node went away recently, not the one of 20 minutes ago,
        # and which shards no live node serves
        went, unserved = shown("#fleet-banner").splitlines()
        assert re.fullmatch(
            r"Node node-b went away \(lease expired\) at \d\d:\d\d:\d\d; its 2 shards are "
            r"being taken over\.",
            went,
        ), went
        assert unserved.startswith("7 shards served by no live node: ")
        assert "SyncOrder \u00d72" in unserved

        # with the jobs waiting there (as the broker counts them now: SQS's counts are
        # approximate, so the page and this read may need a refresh to agree), and their
        # oldest's age where the broker tells it
        def waiting_shown(_: Any) -> str | None:
            shards = [s for w in collect(filled).workers for s in w.shards if s.owner is None]
            waiting = sum(s.length for s in shards)
            assert waiting, "the fixture leaves jobs in shards nobody serves"
            line = text_of(browser, "#fleet-banner").splitlines()[-1]
            return line if f"; {waiting} jobs wait there, " in line else None

        unserved = wait.until(waiting_shown)
        if kind == "sqs":
            assert unserved.endswith(
                ", lag unknown (SQS tells no message ages, and no node reports these shards)."
            ), unserved
        else:
            assert re.search(r"the oldest for \d+\.\d s\.$", unserved), unserved
        assert "stale" in wait.until(lambda d: d.find_element(By.ID, "dot").get_attribute("class"))
        # and each shard names its owner
        sync = '[data-worker="SyncOrder"]'
        wait.until(
            lambda d: (
                d.find_element(By.CSS_SELECTOR, f"{sync} details.shards summary").click() or True
            )
        )
        rows = browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(r => r.innerText)",
            f"{sync} details.shards tbody tr",
        )
        assert [r.split()[-1] for r in rows] == ["node-a", "node-a", "—", "—"]
        if kind == "sqs":
            # and on SQS the lag comes from the owner's report, the total from the live
            # node's, and the total says it leaves the gone nodes out
            assert rows[0].split()[3:5] == ["42.0", "s"]
            # (a lower bound: shards with jobs nobody serves have no known lag)
            assert shown("#t-lag").replace(" ", "") == "\u226542.0s"
            # and the jobs done are the live node's reported count (SQS counts none)
            assert shown("#t-done") == "640"
            title = wait.until(lambda d: d.find_element(By.ID, "t-done").get_attribute("title"))
            assert "7 retried, 3 failed" in title, title
            wait.until(lambda d: text_of(d, "#t-rate").startswith("150"))
            note = shown("#t-rate-note")
            assert note.startswith("excludes node-b (lease expired since ")
            assert "node-c (lease expired since " in note
        # and it fits a phone and a wide screen
        for width in (1400, 1100, 420):
            set_width(browser, width)
            assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
    finally:
        srv.stop()


@HTTP_ONLY
def test_the_page_loads_nothing_from_elsewhere(server: DashboardServer) -> None:
    with urllib.request.urlopen(server.url, timeout=10) as res:
        page = res.read().decode()
        assert res.headers["Content-Type"].startswith("text/html")
        assert "default-src 'none'" in res.headers["Content-Security-Policy"]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|<link""", page)
    assert "https://" not in page and "/api/v1/stats" in page


# -- docs/dashboard.png and docs/dashboard-narrow.png --------------------------------
def screenshot_fleet(store: Any, now: float) -> None:
    """Two live nodes; node-e90b killed 80 s ago (node-7c2e took over one of its two
    shards so far); node-51d0 killed 25 minutes ago."""
    lags = {"SyncOrder:0": 316.0, "SyncOrder:1": 290.0, "SendReceipt:0": 48.0}
    a_held = ("SyncOrder:0", "SyncOrder:1", "SendReceipt:0", "IndexProduct:0", "IndexProduct:1")
    heartbeat(store, "node-a1f3", now - 6, a_held, lags=lags, jobs_per_second=14.2, threads=4)
    b_held = ("SyncOrder:2", "SyncOrder:3", "IndexProduct:2")
    heartbeat(store, "node-7c2e", now - 2, b_held, jobs_per_second=11.4, threads=4)
    heartbeat(store, "node-e90b", now - 80, (), gone="lease expired", gone_at=now - 70)
    heartbeat(store, "node-51d0", now - 1500, (), gone="lease expired", gone_at=now - 1490)
    for name, held in [("node-e90b", ["SyncOrder:3", "SendReceipt:1"]), ("node-51d0", [])]:
        item = store.get(f"node/{name}")
        store.put(f"node/{name}", {**item.value, "held": held}, version=item.version)


@pytest.mark.skipif(
    not os.environ.get("SHARDQ_DASHBOARD_SCREENSHOT"),
    reason="set SHARDQ_DASHBOARD_SCREENSHOT=docs/dashboard.png to redraw the screenshots",
)
def test_screenshot(browser: Any, tmp_path: Path) -> None:
    """Realistic data: several workers with backlogs, jobs in flight, a morgue and
    30 minutes of (synthetic) throughput history; 1400 px wide, then 420 px into the
    same name with ``-narrow``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    filled = app
    broker = make_broker("sqlite", tmp_path, None)  # type: ignore[arg-type]
    app.configure(Config(queue_prefix="prod-", idle_wait_seconds=1), broker=broker)
    rng = random.Random(4)
    SyncOrder.publish_many(
        [
            ("order-7781", {"status": "paid", "error": "payment provider timed out (3 retries)"}),
            ("order-9120", {"status": "paid", "error": "card declined: insufficient funds"}),
            ("order-9120", {"status": "shipped", "error": "order-9120 has no payment"}),
        ]
    )
    SendReceipt.publish("order-5532", {"to": "ann@example.com", "error": "mailbox unavailable"})
    SyncOrder.publish(
        "tenant-acme/eu-west-1/order-2024-11-000981273/line-items/sku-33-blue-xl",
        {
            "status": "paid",
            "lines": ["sku-33-blue-xl"] * 12,
            "error": "line-items/sku-33-blue-xl "
            "refers to warehouse eu-west-1c, which this tenant cannot ship from",
        },
    )
    IndexProduct.publish("sku-33-blue", {"v": 7, "error": "mapping rejected field 'price'"})
    SyncOrder.publish_many([(f"order-{i}", {"status": "paid"}) for i in range(200)])
    run_until_empty()
    SyncOrder.publish_many(
        [(f"order-{rng.randint(1000, 9999)}", {"status": "paid"}) for _ in range(1180)]
    )
    SendReceipt.publish_many(
        [(f"order-{rng.randint(1000, 9999)}", {"to": "x"}) for _ in range(240)]
    )
    IndexProduct.publish_many([(f"sku-{rng.randint(1, 500)}", {"v": 2}) for _ in range(37)])
    for worker, shards, take in [("SyncOrder", 4, 6), ("SendReceipt", 2, 3)]:
        for shard in range(shards):
            filled.broker.receive(
                filled.shard_queue(worker, shard),
                max_messages=take,
                wait_seconds=0,
                visibility_timeout=600,
            )
    with sqlite3.connect(tmp_path / "broker.db") as db:  # age the jobs a little
        db.execute(
            "UPDATE messages SET sent_at = sent_at - CASE WHEN queue LIKE 'prod-sync-order%' "
            "THEN 316 WHEN queue LIKE 'prod-send-receipt%' THEN 48 ELSE 3.2 END"
        )
        rows = db.execute("SELECT rowid, body FROM messages WHERE queue LIKE '%morgue%'")
        for rowid, body in rows.fetchall():  # a record is a JSON head, then the job's body
            head, newline, rest = body.partition("\n")
            record = json.loads(head)
            record["failed_at"] -= 1500
            new = json.dumps(record, separators=(",", ":")) + newline + rest
            db.execute("UPDATE messages SET body = ? WHERE rowid = ?", (new, rowid))
    screenshot_fleet(filled.store, time.time())
    srv = make_server(filled, "127.0.0.1", 0, refresh=3600).start()
    try:
        now = srv.sampler.snapshot()["time"]
        for worker, base, wave in [
            ("SyncOrder", 820, 260),
            ("SendReceipt", 210, 90),
            ("IndexProduct", 45, 30),
        ]:
            srv.sampler.points[worker] = deque(
                (
                    now - 1800 + 10 * i,
                    round(max(0.0, base + wave * math.sin(i / 23) + rng.gauss(0, base / 12)), 1),
                )
                for i in range(181)
            )
        srv.sampler.total = deque(
            (t, round(sum(srv.sampler.points[w][i][1] for w in srv.sampler.points), 1))
            for i, (t, _) in enumerate(srv.sampler.points["SyncOrder"])
        )
        browser.set_window_size(1400, 1000)
        browser.get(srv.url)
        WebDriverWait(browser, 60).until(lambda d: text_of(d, "#t-length") != "—")
        browser.find_element(By.ID, "m-show").click()
        WebDriverWait(browser, 60).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#m-table tr[data-message-id]")) >= 3
        )
        browser.find_element(By.CSS_SELECTOR, '[data-worker="SendReceipt"] summary').click()
        if os.environ.get("SHARDQ_DASHBOARD_DARK"):
            browser.execute_cdp_cmd(
                "Emulation.setEmulatedMedia",
                {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
            )
        out = Path(os.environ["SHARDQ_DASHBOARD_SCREENSHOT"])
        out.parent.mkdir(parents=True, exist_ok=True)
        for width, path in [(1400, out), (420, out.with_name(f"{out.stem}-narrow{out.suffix}"))]:
            set_width(browser, width)
            height = browser.execute_script("return document.documentElement.scrollHeight")
            set_width(browser, width, int(height))
            time.sleep(0.5)
            assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
            assert browser.save_screenshot(str(path))
    finally:
        srv.stop()
        broker.close()


def run_dashboard_command(tmp_path: Path, polls: int, **env: str) -> list[str]:
    """``shardq dashboard`` with a config file saying ``log_format: json`` and
    ``log_level: info``: poll its stats ``polls`` times, stop it, return its log lines."""
    config = tmp_path / "shardq.yaml"
    config.write_text(
        "app: tests.apps.ledger\nbroker_url: memory://\nlog_format: json\nlog_level: info\n"
    )
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(
        [sys.executable, "-m", "shardq", "dashboard", "--config", str(config), "--port", "0"],
        cwd=root,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        while not any("dashboard.started" in line for line in lines):
            assert time.monotonic() < deadline and child.poll() is None, lines
            lines.append(child.stdout.readline())
        url = re.search(r"http://127\.0\.0\.1:\d+/", lines[-1])
        assert url, lines
        for _ in range(polls):
            with urllib.request.urlopen(url.group(0) + "api/v1/stats", timeout=10) as res:
                assert res.status == 200
        os.kill(child.pid, signal.SIGTERM)
        lines += child.communicate(timeout=20)[0].splitlines()
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    return [line.strip() for line in lines if line.strip()]


def test_the_dashboard_command_logs_as_configured_and_polls_only_at_debug(
    tmp_path: Path,
) -> None:
    # given the config's log_format json and log_level info
    lines = run_dashboard_command(tmp_path, polls=5)
    # then every line is a JSON event, and the polls are not logged
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["dashboard.started", "dashboard.stopped"]
    assert {e["level"] for e in events} == {"info"}
    # and at debug (the environment overrides the file) each request is logged
    events = [
        json.loads(line)
        for line in run_dashboard_command(tmp_path, polls=3, SHARDQ_LOG_LEVEL="debug")
    ]
    requests = [e for e in events if e["event"] == "dashboard.request"]
    assert len(requests) == 3 and {e["level"] for e in requests} == {"debug"}
    assert "GET /api/v1/stats" in requests[0]["line"]


def test_serve_blocks_until_sigterm_and_stops_cleanly() -> None:
    script = (
        "import shardq\n"
        "from shardq.broker import MemoryBroker\n"
        "from shardq.ops.dashboard import serve\n"
        "app = shardq.App(broker=MemoryBroker())\n"
        "@app.register\n"
        "class W(shardq.Worker):\n"
        "    def perform(self, entity_id, payloads): pass\n"
        "serve(app, port=0, refresh=0.2)\n"
        "print('returned', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert child.stdout is not None
        line = ""
        deadline = time.monotonic() + 20
        while "dashboard.started" not in line and time.monotonic() < deadline:
            line = child.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        with urllib.request.urlopen(url.group(0) + "api/v1/stats", timeout=10) as res:
            assert json.loads(res.read())["by_worker"]["W"]["length"] == 0
        os.kill(child.pid, signal.SIGTERM)
        rest = child.communicate(timeout=20)[0]
        assert child.returncode == 0 and "dashboard.stopped" in rest and "returned" in rest
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
