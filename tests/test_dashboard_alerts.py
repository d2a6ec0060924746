"""The dashboard's fleet alerts in a real headless Chromium, at desktop and phone
widths: shards nobody serves with their backlog and the oldest job's age, and no live
node at all."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardq
from shardq.core.config import Config
from shardq.ops.dashboard import DashboardServer, make_server
from shardq.ops.ensure import ensure_state_table
from shardq.ops.sampler import Sampler
from tests.conftest import make_broker
from tests.fleet_items import heartbeat
from tests.test_dashboard import LAYOUT_PROBLEMS, browser, chromium, set_width, text_of  # noqa: F401

app = shardq.App()


@app.register
class Billing(shardq.Worker):
    shards = 2

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        return None


@pytest.fixture
def billing(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[shardq.App]:
    """Billing with jobs waiting in both its shards (nobody ran them)."""
    broker = make_broker("sqlite", tmp_path, request)
    app.configure(Config(queue_prefix="a-", idle_wait_seconds=1), broker=broker)
    ensure_state_table(app)
    Billing.publish_many([(f"b{i}", {"n": i}) for i in range(40)])
    yield app
    broker.close()


def banner_lines(driver: Any) -> list[str]:
    return text_of(driver, "#fleet-banner").splitlines()


def served(app: shardq.App, shard: int) -> int:
    return app.broker.counts(app.shard_queue("Billing", shard)).waiting


@pytest.mark.parametrize("width", [1400, 390])
def test_a_static_nodes_shards_wait_for_it_with_their_backlog_and_age(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    billing: shardq.App,
    width: int,
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    # given static node s0 live serving Billing:0, and static node s1, which served
    # Billing:1, silent for 90 s (no elastic node is there to take its shard)
    now = time.time()
    heartbeat(billing.store, "s0", now, ("Billing:0",), mode="static")
    heartbeat(billing.store, "s1", now - 90, ("Billing:1",), mode="static")
    srv = make_server(billing, "127.0.0.1", 0, refresh=0.5).start()
    try:
        # when the page is shown
        set_width(browser, width)
        browser.get(srv.url)
        WebDriverWait(browser, 60).until(lambda d: len(banner_lines(d)) == 2)
        went, unserved = banner_lines(browser)
        # then s1 is said to have stopped reporting, its shard served by nobody (a
        # static node's shards are not taken over)
        assert re.fullmatch(
            r"Node s1 stopped reporting at \d\d:\d\d:\d\d; its 1 shard is served by nobody\.", went
        ), went
        # and the shard nobody serves comes with its backlog and its oldest job's age
        waiting = served(billing, 1)
        assert re.fullmatch(
            rf"1 shard served by no live node: Billing \u00d71; {waiting} jobs wait there, the "
            r"oldest for \d+\.\d s\.",
            unserved,
        ), unserved
        assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
    finally:
        srv.stop()


@pytest.mark.parametrize("width", [1400, 390])
def test_with_no_live_node_the_page_says_so_with_the_backlog(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    billing: shardq.App,
    width: int,
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    # given jobs waiting and no node running (none ever started)
    srv = make_server(billing, "127.0.0.1", 0, refresh=0.5).start()
    try:
        # when the page is shown
        set_width(browser, width)
        browser.get(srv.url)
        WebDriverWait(browser, 60).until(lambda d: banner_lines(d))
        (alert,) = banner_lines(browser)
        # then it says no live node serves anything, how many jobs wait and how long
        assert re.fullmatch(
            r"No live node at all: no shard is served; 40 jobs wait there, the oldest for "
            r"\d+\.\d s\. Start a node \(shardq run\)\.",
            alert,
        ), alert
        assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
    finally:
        srv.stop()


class Blind(Sampler):
    """The broker's sample, with the lags of shards with jobs unknown as on SQS for
    shards no live node serves: Billing's shard 1 (``blind`` 1), or both (2)."""

    blind = 1

    def snapshot(self, wait: float = 10.0) -> dict[str, Any]:
        doc = copy.deepcopy(super().snapshot(wait))
        worker = doc["by_worker"]["Billing"]
        for shard in worker["shards"][2 - self.blind :]:
            shard["lag"] = None
        known = [s["lag"] for s in worker["shards"] if s["lag"] is not None]
        worker["lag"] = doc["total"]["lag"] = max(known, default=None)
        return doc


@pytest.mark.parametrize("width", [1400, 390])
def test_a_lag_that_leaves_out_shards_of_unknown_age_is_shown_as_a_lower_bound(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    billing: shardq.App,
    width: int,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given Billing's shard 1 holding jobs whose age nobody knows (SQS, nobody serves it)
    assert served(billing, 0) and served(billing, 1)
    sampler = Blind(billing, 0.5)
    srv = DashboardServer(billing, "127.0.0.1", 0, None, sampler).start()
    card = '[data-worker="Billing"] [data-k="lag"]'
    try:
        # when the page is shown
        set_width(browser, width)
        browser.get(srv.url)
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: text_of(d, "#t-lag") != "—")
        # then the total's and the worker's lags are "at least" the known one
        assert re.fullmatch(r"≥ \d+\.\d\s*s", text_of(browser, "#t-lag")), text_of(
            browser, "#t-lag"
        )
        assert text_of(browser, card).startswith("≥ ")
        title = browser.find_element(By.CSS_SELECTOR, card).get_attribute("title") or ""
        assert title.startswith("at least: 1 shard with jobs waiting has no known lag"), title
        assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
        # when no shard with jobs has a known age, then the lag is unknown, never 0
        sampler.blind = 2
        wait.until(lambda d: text_of(d, "#t-lag") == "unknown")
        assert text_of(browser, card) == "unknown"
    finally:
        srv.stop()


class StoreDown(Sampler):
    """The broker's sample as when the state store cannot be read: no morgue sizes."""

    def snapshot(self, wait: float = 10.0) -> dict[str, Any]:
        doc = copy.deepcopy(super().snapshot(wait))
        for counts in [doc["total"], *doc["by_worker"].values()]:
            counts["morgue_length"] = None
        doc["morgue_error"] = "the store is down (test)"
        return doc


def test_morgue_sizes_the_store_cannot_give_are_said_unknown_never_0(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    billing: shardq.App,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given a sample whose morgue sizes the state store could not give, and a node that
    # stopped reporting 90 s ago
    heartbeat(billing.store, "s1", time.time() - 90, ("Billing:1",), mode="static")
    srv = DashboardServer(billing, "127.0.0.1", 0, None, StoreDown(billing, 0.5)).start()
    try:
        # when the page is shown
        browser.get(srv.url)
        WebDriverWait(browser, 60).until(lambda d: text_of(d, "#banner") and banner_lines(d))
        # then it says why, and no size is shown as a number: not "0 dead"
        assert text_of(browser, "#banner") == (
            "Cannot read the morgue sizes from the state store: the store is down (test)"
        )
        assert text_of(browser, "#t-morgue_length") == "—"
        options = browser.find_elements(By.CSS_SELECTOR, "#m-worker option")
        labels = [o.text for o in options if o.get_attribute("value")]
        assert labels == ["Billing · ? dead"], labels
        # and the node gone still marks the page stale
        assert "stale" in (browser.find_element(By.ID, "dot").get_attribute("class") or "")
    finally:
        srv.stop()
