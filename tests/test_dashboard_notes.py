"""Long notes on the dashboard's cards wrap inside them without stretching the cards, in a
real headless Chromium at desktop and phone widths."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardq.broker import MemoryBroker
from shardq.core.config import Config
from shardq.ops.dashboard import DashboardServer
from shardq.ops.sampler import Sampler
from tests.test_dashboard import LAYOUT_PROBLEMS, browser, chromium, set_width  # noqa: F401 (fixture)
from tests.test_dashboard_methods import app

EXCLUDED = [
    f"http://ip-10-0-{n}-{n * 7}.eu-west-1.compute.internal:9464/metrics?node=node-{n}-{'x' * 30}"
    for n in range(4)
]


class LongNotes(Sampler):
    """The broker's sample, with four scrape targets not answering."""

    exclude = False

    def snapshot(self, wait: float = 10.0) -> dict[str, Any]:
        doc = super().snapshot(wait)
        if self.exclude:
            doc["throughput_excludes"] = [
                {"node": url, "since": doc["time"] - 60, "reason": "not answering"}
                for url in EXCLUDED
            ]
        return doc


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    app.configure(Config(), broker=MemoryBroker())
    app.ensure_queues()
    srv = DashboardServer(app, "127.0.0.1", 0, None, LongNotes(app, 0.5)).start()
    yield srv
    srv.stop()


CARDS = """return [...document.querySelectorAll(".totals .card")].map(
  c => Math.round(c.getBoundingClientRect().height));"""


def card_heights(driver: Any) -> list[int]:
    return list(driver.execute_script(CARDS))


@pytest.mark.parametrize("width", [1400, 390])
def test_a_long_excludes_note_wraps_without_stretching_the_cards(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    server: DashboardServer,
    width: int,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    set_width(browser, width)
    browser.get(server.url)
    wait.until(lambda d: d.find_element(By.ID, "t-length").text != "—")
    plain = card_heights(browser)
    # when four long metrics URLs are left out of the throughput
    assert isinstance(server.sampler, LongNotes)
    server.sampler.exclude = True
    wait.until(lambda d: d.find_element(By.ID, "t-rate-note").is_displayed())
    note = browser.find_element(By.ID, "t-rate-note")
    # then the note wraps inside its card: at most two lines more, and the rest on hover
    line = float(
        browser.execute_script("return parseFloat(getComputedStyle(arguments[0]).lineHeight)", note)
    )
    heights = card_heights(browser)
    assert max(heights) <= max(plain) + 2 * line + 6, (plain, heights)
    assert all(url in (note.get_attribute("title") or "") for url in EXCLUDED)
    assert browser.execute_script(LAYOUT_PROBLEMS) == [], width


@pytest.mark.parametrize("width", [1400, 390])
def test_the_page_alerts_when_no_queue_exists(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    width: int,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given a dashboard whose queue_prefix has no queues (a typo)
    app.configure(Config(queue_prefix="typo-"), broker=MemoryBroker())
    srv = DashboardServer(app, "127.0.0.1", 0, None, Sampler(app, 0.5)).start()
    try:
        set_width(browser, width)
        browser.get(srv.url)
        # then the page shows an alert saying so, and still fits the screen
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "queues-banner").is_displayed())
        text = browser.find_element(By.ID, "queues-banner").text
        assert text.startswith("No queues of this app exist with queue_prefix 'typo-'"), text
        assert browser.execute_script(LAYOUT_PROBLEMS) == [], width
        # and once the queues exist, the alert goes away
        app.ensure_queues()
        wait.until(lambda d: not d.find_element(By.ID, "queues-banner").is_displayed())
    finally:
        srv.stop()
