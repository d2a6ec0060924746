"""The dashboard's morgue in a real headless Chromium: an answer that arrives after a
newer search was asked for is dropped, never drawn over the newer one."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import shardq
from shardq.ops.dashboard import Handler, make_server
from tests.test_dashboard import (  # noqa: F401 (fixtures)
    LAYOUT_PROBLEMS,
    browser,
    chromium,
    filled,
    set_width,
    text_of,
)


class Gate:
    """Holds back the first unfiltered morgue listing asked for once ``armed``."""

    def __init__(self) -> None:
        self.armed = False
        self.held = threading.Event()  # the listing arrived and waits
        self.release = threading.Event()
        self.answered = threading.Event()  # its answer was sent

    def hold(self, path: str) -> bool:
        if self.armed and "/api/v1/morgue/" in path and "entity=" not in path:
            self.armed = False
            return True
        return False


def gated(gate: Gate) -> type[Handler]:
    class Gated(Handler):
        def do_GET(self) -> None:
            if not gate.hold(self.path):
                return super().do_GET()
            gate.held.set()
            gate.release.wait(30)
            super().do_GET()
            gate.answered.set()

    return Gated


@pytest.mark.parametrize("kind", ["sqlite"])
def test_a_listing_answered_late_does_not_overwrite_a_newer_search(
    browser: Any,  # noqa: F811 (the headless Chromium fixture)
    filled: shardq.App,  # noqa: F811 (3 dead SyncOrder jobs: 2 of o1, 1 of o2)
) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    gate = Gate()
    srv = make_server(filled, "127.0.0.1", 0, refresh=0.5)
    srv.RequestHandlerClass = gated(gate)
    srv.start()
    dead = "#m-table tr[data-message-id]"

    def rows(d: Any) -> list[str]:  # read in one script: a redraw cannot cut it short
        script = "return [...document.querySelectorAll(arguments[0])].map(r => r.dataset.entity)"
        return list(d.execute_script(script, dead))

    try:
        wait = WebDriverWait(browser, 60)
        set_width(browser, 1400)
        browser.get(srv.url)
        wait.until(lambda d: d.find_element(By.ID, "m-worker").get_attribute("value"))
        browser.find_element(By.ID, "m-show").click()
        wait.until(lambda d: sorted(rows(d)) == ["o1", "o1", "o2"])
        # given a refresh of the whole morgue whose answer is slow to come
        gate.armed = True
        browser.find_element(By.ID, "m-show").click()
        assert gate.held.wait(60), "the listing did not reach the server"
        # when an entity is clicked meanwhile, and its dead jobs are shown
        browser.find_element(By.CSS_SELECTOR, f'{dead}[data-entity="o2"] button.entity').click()
        wait.until(lambda d: rows(d) == ["o2"])
        # and then the older answer arrives
        gate.release.set()
        assert gate.answered.wait(60), "the held listing was not answered"
        # then the page keeps the entity's dead jobs: the late answer is dropped
        with pytest.raises(TimeoutException):
            WebDriverWait(browser, 3).until(lambda d: rows(d) != ["o2"])
        assert browser.find_element(By.ID, "m-entity").get_attribute("value") == "o2"
        assert text_of(browser, "#m-status").startswith("1 dead SyncOrder job shown")
        assert browser.find_element(By.ID, "m-show").is_enabled()
    finally:
        gate.release.set()
        srv.stop()
