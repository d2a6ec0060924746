"""Screenshots of the dashboard's fleet alerts, in a real headless Chromium, at desktop
(1400 px) and phone (390 px) width: docs/dashboard-alert-*.png.

Exact command (from the repo root; needs chromium and chromedriver, takes ~3 min)::

    python bench/alert_screenshots.py --out docs

Everything is real: a temporary directory holds an app (``workers.py``: SyncOrder,
4 shards, and SendReceipt, 2 shards, each job taking 0.5 s), its ``shardq.yaml``
(the embedded SQLite broker, ``lease_seconds`` 10, ``reshard_trust_seconds`` 6,
``concurrency`` 4) and
the nodes' logs; the nodes are ``python -m shardq run`` child processes of a static
plan of 2 nodes (``--node 0/1 --nodes 2``); the dashboard is this process's
:func:`shardq.ops.dashboard.make_server` on 127.0.0.1 over the same broker file. Steps:

1. ``queues ensure``; 1,200 SyncOrder and 300 SendReceipt jobs published; both
   nodes started; node 1 killed with SIGKILL 8 s later, then 65 s waited (no live
   node judges a static node: its heartbeat is shown ``not reporting`` after 60 s).
   **unserved**: the shards of node 1 nobody serves, with the jobs waiting there
   and the oldest's age (the embedded broker tells it; on SQS it says "lag unknown").
2. ``shardq reshard SyncOrder --shards 6 --no-wait``; node 0 writes the switch after
   the trust window. **reshard**: the reshard stuck behind the old shards of node 1,
   naming them and node 1 as their last holder.
3. node 0 killed with SIGKILL, 65 s waited. **no-node**: no live node at all.

Each page is checked for overflow (the page no wider than the screen, no card
scrolling sideways) before its screenshot. Children are stopped by their pid; the
temporary directory is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _common import ROOT, machine

WORKERS = """\
import time

import shardq

app = shardq.App()


@app.register
class SyncOrder(shardq.Worker):
    shards = 4

    def perform(self, entity_id, payloads):
        time.sleep(0.5 * len(payloads))


@app.register
class SendReceipt(shardq.Worker):
    shards = 2

    def perform(self, entity_id, payloads):
        time.sleep(0.5 * len(payloads))
"""

OVERFLOW = """
const problems = [], page = document.documentElement, width = page.clientWidth;
if (page.scrollWidth > width) problems.push(`the page is ${page.scrollWidth} px wide`);
for (const box of document.querySelectorAll(".card, .fleet-banner div, .reshard-banner")) {
  if (box.scrollWidth > box.clientWidth + 1) problems.push(`${box.className || box.id} overflows`);
}
return problems;
"""


class Scene:
    """The app's directory, its config and its node processes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (base / "workers.py").write_text(WORKERS)
        config = {
            "broker_url": f"sqlite:///{base / 'broker.db'}",
            "queue_prefix": "shop-",
            "idle_wait_seconds": 1,
            "lease_seconds": 10,
            "layout_refresh_seconds": 1,
            "reshard_trust_seconds": 6,
            "concurrency": 4,
            "log_format": "json",
        }
        (base / "shardq.yaml").write_text(yaml.safe_dump(config))
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "shardq", *args],
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise SystemExit(f"shardq {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    def start(self, node: int) -> None:
        log = open(self.base / f"node-{node}.log", "wb")  # noqa: SIM115 (kept by the child)
        self.nodes[node] = subprocess.Popen(
            [sys.executable, "-m", "shardq", "run", "--node", str(node), "--nodes", "2"],
            cwd=self.base,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, node: int) -> None:
        child = self.nodes.pop(node)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)

    def stop_all(self) -> None:
        for node in list(self.nodes):
            self.kill(node)


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def set_width(driver: Any, width: int, height: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def shoot(driver: Any, url: str, ready: str, out: Path, name: str) -> None:
    """Load the page until ``ready`` (JS returning true), then save it at both widths."""
    from selenium.webdriver.support.ui import WebDriverWait

    for width, suffix in [(1400, ""), (390, "-narrow")]:
        set_width(driver, width, 900)
        driver.get(url)
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(ready))
        time.sleep(1.5)  # a second round of the nodes' poll: the banner is complete
        height = driver.execute_script("return document.documentElement.scrollHeight")
        set_width(driver, width, min(int(height), 1300 if width < 600 else 2400))
        time.sleep(0.5)
        problems = driver.execute_script(OVERFLOW)
        if problems:
            raise SystemExit(f"{name} at {width} px: {problems}")
        path = out / f"dashboard-alert-{name}{suffix}.png"
        driver.save_screenshot(str(path))
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="directory of the PNGs")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(machine())
    from shardq.ops.logs import configure

    configure("console", "info")  # not each HTTP request
    base = Path(tempfile.mkdtemp(prefix="shardq-alerts-"))
    scene = Scene(base)
    driver, server = None, None
    try:
        scene.cli("queues", "ensure")
        sys.path.insert(0, str(base))
        import workers  # the app of the temporary directory
        from shardq.core.config import Config
        from shardq.ops.dashboard import make_server

        config = Config.load(str(base / "shardq.yaml"))
        workers.app.configure(config)
        workers.SyncOrder.publish_many([(f"order-{i % 400}", {"n": i}) for i in range(1200)])
        workers.SendReceipt.publish_many([(f"order-{i % 150}", {"to": "x"}) for i in range(300)])
        scene.start(0)
        scene.start(1)
        time.sleep(8)
        scene.kill(1)
        print("node 1 killed; waiting 65 s until its heartbeat is shown not reporting")
        time.sleep(65)
        server = make_server(workers.app, "127.0.0.1", 0, refresh=1.0).start()
        driver = browser()
        unserved = "return !!document.querySelector('#fleet-banner [data-unserved]')"
        shoot(driver, server.url, unserved, out, "unserved")

        scene.cli("reshard", "SyncOrder", "--shards", "6", "--no-wait")
        stuck = (
            "const b = document.querySelector('#reshard-banner div');"
            "return !!b && b.textContent.includes('last held by')"
        )
        print("reshard begun; waiting for the switch and its stuck alert")
        shoot(driver, server.url, stuck, out, "reshard")

        scene.kill(0)
        print("node 0 killed; waiting 65 s")
        time.sleep(65)
        none = (
            "const b = document.querySelector('#fleet-banner [data-unserved]');"
            "return !!b && b.textContent.startsWith('No live node at all')"
        )
        shoot(driver, server.url, none, out, "no-node")
    finally:
        if driver is not None:
            driver.quit()
        if server is not None:
            server.stop()
        scene.stop_all()
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
