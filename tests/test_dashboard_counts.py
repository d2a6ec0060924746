"""Jobs done, retried and failed per worker, from the live nodes' reports (what SQS
cannot count): in a real node's heartbeat, in ``shardq stats``' JSON and on the page."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.core.config import Config
from shardq.core.fleet_rules import ELASTIC
from shardq.core.plan import Plan
from shardq.ops.dashboard import DashboardServer
from shardq.ops.ensure import ensure_state_table
from shardq.ops.sampler import Sampler
from shardq.ops.stats import collect
from tests.conftest import make_broker
from tests.fleet_items import heartbeat
from tests.test_dashboard import LAYOUT_PROBLEMS, browser, chromium, set_width  # noqa: F401 (fixture)

app = shardq.App()


class Counted(shardq.Worker, abstract=True):
    """``{"retry": true}`` fails its first attempt; ``{"dead": true}`` every one."""

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        for payload in payloads:
            if payload.get("dead"):
                raise shardq.PermanentError("never")
            if payload.get("retry") and self.attempt == 1:
                raise shardq.Retry(delay=0)


@app.register
class Billing(Counted):
    shards = 2


@app.register
class Mailing(Counted):
    shards = 1


@pytest.fixture
def counted_app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[shardq.App]:
    broker = make_broker("sqlite", tmp_path, request)
    config = Config(queue_prefix="c-", idle_wait_seconds=1, lease_seconds=10)
    app.configure(config, broker=broker)
    ensure_state_table(app)
    yield app
    broker.close()


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_nodes_report_counts_each_workers_jobs_and_stats_sum_them(
    counted_app: shardq.App,
) -> None:
    # given 3 Billing jobs (one retried once, one that dies) and 2 Mailing jobs
    Billing.publish_many([("b1", {}), ("b2", {"retry": True}), ("b3", {"dead": True})])
    Mailing.publish_many([("m1", {}), ("m2", {})])
    # when an elastic node runs them
    node = counted_app.node(Plan(0, 0, ()), threads=2, membership=ELASTIC)
    runner = threading.Thread(target=node.run, daemon=True)
    runner.start()
    try:

        def per_worker() -> dict[str, Any]:
            stats = collect(counted_app).to_dict()["by_worker"]
            return {name: w["reported"] for name, w in stats.items()}

        # then stats show, per worker, what the live node reported it did
        billing = {"done": 2 + 1, "retried": 1, "failed": 1}  # done: succeeded or morgued
        mailing = {"done": 2, "retried": 0, "failed": 0}
        wait_for(lambda: per_worker() == {"Billing": billing, "Mailing": mailing}, 60, "counts")
        # and the per-worker figures add up to the node's totals
        fleet = collect(counted_app).to_dict()["fleet"]
        assert (fleet["done"], fleet["retried"], fleet["failed"]) == (5, 1, 1)
    finally:
        node.stop()
        runner.join(30)


def test_stats_say_no_counts_when_no_node_ever_reported(counted_app: shardq.App) -> None:
    # given jobs published and no node ever started
    Billing.publish("b1", {})
    # then the per-worker counts are unknown, not zero
    stats = collect(counted_app).to_dict()
    assert {w["reported"] for w in stats["by_worker"].values()} == {None}


@pytest.mark.parametrize("width", [1400, 390])
def test_each_worker_card_shows_its_counts_since_the_live_nodes_started(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    counted_app: shardq.App,
    width: int,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given two live nodes reporting Billing's jobs, one of them Mailing's too
    now, store = time.time(), counted_app.store
    a = {"Billing": {"done": 120, "retried": 4, "failed": 1}}
    b = {"Billing": {"done": 30, "retried": 0, "failed": 2}}
    b["Mailing"] = {"done": 7, "retried": 1, "failed": 0}
    heartbeat(store, "node-a", now, ("Billing:0",), by_worker=a, done=121, retried=4, failed=1)
    heartbeat(store, "node-b", now, ("Billing:1", "Mailing:0"), by_worker=b, done=37)
    srv = DashboardServer(counted_app, "127.0.0.1", 0, None, Sampler(counted_app, 0.5)).start()
    try:
        # when the page is shown
        set_width(browser, width)
        browser.get(srv.url)
        wait = WebDriverWait(browser, 60)

        def counted(worker: str) -> str:
            css = f'[data-worker="{worker}"] .counted'
            return str(browser.find_element(By.CSS_SELECTOR, css).text)

        # then each worker's card sums the live nodes' counts of that worker
        wait.until(lambda d: counted("Billing") != "")
        since = "since the live nodes started"
        assert counted("Billing") == f"150 done · 4 retried · 3 failed {since}"
        assert counted("Mailing") == f"7 done · 1 retried · 0 failed {since}"
        assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
    finally:
        srv.stop()
