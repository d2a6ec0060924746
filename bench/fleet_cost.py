"""What an elastic fleet costs in SQS requests while idle, and what a kill -9 looks like.

**Cost** (the default): fleets of elastic nodes (``shardq run`` without ``--node``,
default settings: lease_seconds 30, report_seconds 45, idle_wait_seconds 20, 4 threads)
on one ministack emulator behind the counting proxy (``bench/peers/proxy.py``), with no
jobs flowing. Each fleet has its own queue prefix, so the proxy's per-queue counts
(``/__proxy/queues``) attribute every request to one fleet and, within it, to its
leases queue, its fleet state queue or its job queues. The fleets run side by side;
once every fleet has settled (every shard held by exactly one node, as the fleet
document says) and ``--settle`` more seconds have passed, the counts are snapshotted,
``--minutes`` pass, and they are snapshotted again.

    python bench/fleet_cost.py --minutes 10
    python bench/fleet_cost.py --minutes 2 --fleet 1x1x8     # a quick look at one fleet

``--fleet NxWxS`` is N nodes, W workers of S shards each (repeatable; default the
three fleets 3x3x8, 3x3x100 and 1x1x8). Requests are sorted into parts:

* renewals: ChangeMessageVisibilityBatch on the leases queue that set every entry
  to a hold, lease_seconds - 3 (a node's leases and its presence, 10 per request; the
  presence alone gets 1.5 holds every other round when the leases fill batches);
* long polls: ReceiveMessage on the leases queue that returned nothing;
* takeovers: ReceiveMessage on the leases queue that returned leases, the visibility
  changes that bounce or release them, presence sends and deletes;
* reports: every request on the fleet state queue (receive + send + delete per
  write, and peeks);
* layout: requests on the layout queue (a node looks at the live layout every 5
  minutes when no reshard is under way);
* job-queue idle polls, reported apart: they existed before the fleet (one 20 s long
  poll per idle shard).

Per node-hour is (long polls + reports + takeovers + layout) / node-hours; per shard-hour is
renewals / shard-hours (the presence rides in the renewal batches). The bound
checked is fleet requests per hour <= 40 x shards + 360 x nodes.

``--lease-seconds`` and ``--report-seconds`` set the nodes' settings (default 30 and
45, the shipped defaults), to see what another lease timeout costs; ``--static``
runs static nodes (``--node N --nodes M``: reports only, no leases) instead.

**Kill scenario** (``--scenario kill``): 3 elastic nodes, 3 workers x 8 shards, and
``shardq dashboard`` on ministack (no proxy). Once settled, one node gets SIGKILL;
the script then runs ``shardq nodes --json`` and reads the dashboard's
``/api/v1/nodes`` in a loop (about one round per 1.5 s: each ``shardq nodes`` is a
new process) and records, from the kill: when the node is shown gone, when every
shard it held is shown held by the others, and (from the others' logs) when the node
was first logged gone (``fleet.node_gone``) and when the last of its shards was taken
(``fleet.took``). With ``--screenshot PATH`` it saves the dashboard (headless
chromium, as ``tests/test_dashboard.py`` does) once both are shown. With
``--then-stop`` it waits for the two others to be balanced (as reported), then stops
one of them with SIGTERM and times the same things (a scale-in).

    python bench/fleet_cost.py --scenario kill --then-stop --settle 20 \
        --screenshot docs/fleet-node-gone.png

Ministack, the proxy, the nodes and the dashboard are started here on 127.0.0.1 and
stopped by their pids at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import ROOT, git_head, machine, table  # noqa: E402

import shardq  # noqa: E402
from shardq.fleet import lease_timing  # noqa: E402

BOUND_PER_SHARD, BOUND_PER_NODE = 40, 360


# -- the app the child nodes load (shardq run --app fleet_cost) --------------------------
def build_app(workers: int, shards: int) -> shardq.App:
    """``workers`` blank workers ``W0``.. of ``shards`` shards each."""
    app = shardq.App()
    for i in range(workers):

        def perform(self: shardq.Worker, entity_id: str, payloads: list[Any]) -> None:
            pass

        app.register(type(f"W{i}", (shardq.Worker,), {"shards": shards, "perform": perform}))
    return app


if "FLEET_COST_WORKERS" in os.environ:  # a child node: the app of its fleet
    app = build_app(int(os.environ["FLEET_COST_WORKERS"]), int(os.environ["FLEET_COST_SHARDS"]))


# -- processes ---------------------------------------------------------------------------
@dataclass
class Fleet:
    nodes: int
    workers: int
    shards: int  # per worker
    prefix: str
    lease_seconds: int
    report_seconds: int
    static: bool
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    @property
    def name(self) -> str:
        return f"{self.nodes}x{self.workers}x{self.shards}"

    @property
    def total_shards(self) -> int:
        return self.workers * self.shards

    def keys(self) -> set[str]:
        return {f"W{w}:{s}" for w in range(self.workers) for s in range(self.shards)}


def parse_fleet(text: str) -> tuple[int, int, int]:
    try:
        nodes, workers, shards = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NODESxWORKERSxSHARDS (3x3x8), got {text!r}"
        ) from None
    if min(nodes, workers, shards) < 1 or shards > 1000:
        raise argparse.ArgumentTypeError(f"expected positive counts, shards <= 1000: {text!r}")
    return nodes, workers, shards


def node_env(
    endpoint: str, prefix: str, workers: int, shards: int, lease: int, report: int
) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "SHARDQ_BROKER_URL": "sqs://",
        "SHARDQ_REGION": "us-east-1",
        "SHARDQ_ENDPOINT_URL": endpoint,
        "SHARDQ_QUEUE_PREFIX": prefix,
        "SHARDQ_APP": "fleet_cost",
        "SHARDQ_LOG_FORMAT": "json",
        "SHARDQ_LEASE_SECONDS": str(lease),
        "SHARDQ_REPORT_SECONDS": str(report),
        "FLEET_COST_WORKERS": str(workers),
        "FLEET_COST_SHARDS": str(shards),
    }


def start_fleet(
    nodes: int, workers: int, shards: int, endpoint: str, logdir: Path, args: argparse.Namespace
) -> Fleet:
    prefix = f"f{uuid.uuid4().hex[:6]}-"
    lease, report = args.lease_seconds, args.report_seconds
    env = node_env(endpoint, prefix, workers, shards, lease, report)
    subprocess.run(  # create the job queues ahead, as a deploy step would
        [sys.executable, "-m", "shardq", "queues", "ensure"],
        cwd=HERE,
        env=env,
        check=True,
        capture_output=True,
    )
    fleet = Fleet(nodes, workers, shards, prefix, lease, report, args.static, env, [], [])
    for i in range(nodes):
        log = logdir / f"{prefix}node{i}.log"
        plan = ["--node", str(i), "--nodes", str(nodes)] if args.static else []
        with open(log, "wb") as out:
            fleet.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "shardq", "run", *plan],
                    cwd=HERE,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        fleet.logs.append(log)
    return fleet


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Stop one process we started, by its pid: ``sig``, then SIGKILL if it lingers."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def emulator_and_proxy(with_proxy: bool) -> Iterator[tuple[str, str]]:
    """(emulator endpoint, endpoint for the nodes: the proxy's or the emulator's)."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    from tests import emulator as emu

    server = emu.start()
    print(f"ministack pid {server.pid} at {server.endpoint_url}", flush=True)
    proxy = None
    try:
        endpoint = server.endpoint_url
        if with_proxy:
            proxy = subprocess.Popen(
                [sys.executable, str(HERE / "peers" / "proxy.py"), "--upstream", endpoint],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
            )
            assert proxy.stdout is not None
            line = proxy.stdout.readline().decode().split()
            if len(line) != 2 or line[0] != "PROXY":
                raise RuntimeError(f"the proxy did not start: {line}")
            endpoint = f"http://127.0.0.1:{line[1]}"
            print(f"proxy pid {proxy.pid} at {endpoint}", flush=True)
        yield server.endpoint_url, endpoint
    finally:
        if proxy is not None:
            stop(proxy, grace=2.0)
        emu.stop(server)
        print(f"ministack pid {server.pid} stopped", flush=True)


def fleet_doc(endpoint: str, prefix: str) -> Any:
    """The fleet's document, read straight from the emulator (not counted)."""
    from shardq.broker.sqs import SqsBroker
    from shardq.fleet_store import FleetStore, fleet_queue

    broker = SqsBroker(region="us-east-1", endpoint_url=endpoint)
    return FleetStore(broker, fleet_queue(prefix)).read(timeout=10.0)


def settled(fleet: Fleet, endpoint: str, live: int | None = None) -> bool:
    """Every shard held by exactly one of the fleet's ``live`` nodes (default: all), each
    within one of its fair share, as the fleet document says."""
    live = fleet.nodes if live is None else live
    try:
        doc = fleet_doc(endpoint, fleet.prefix)
    except shardq.ShardqError:
        return False
    if doc is None or len(doc.nodes) != live:
        return False
    held = [k for r in doc.nodes.values() for k in r.held]
    fair = fleet.total_shards / live
    shares = [len(r.held) for r in doc.nodes.values()]
    return (
        sorted(held) == sorted(fleet.keys())
        and max(shares) <= math.ceil(fair)
        and min(shares) >= math.floor(fair)
    )


def wait_until(what: str, check: Callable[[], bool], timeout: float, every: float = 2.0) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - start


# -- cost ----------------------------------------------------------------------------------
def queue_counts(proxy_endpoint: str) -> Counter[str]:
    with urllib.request.urlopen(f"{proxy_endpoint}/__proxy/queues", timeout=10) as resp:
        return Counter(json.loads(resp.read()))


def parts(fleet: Fleet, counts: Counter[str]) -> dict[str, Counter[str]]:
    """The fleet's requests by part (see the module doc), each by queue-less key."""
    leases, state = f"{fleet.prefix}shardq-leases.fifo", f"{fleet.prefix}shardq-fleet.fifo"
    layout = f"{fleet.prefix}shardq-layout.fifo"
    out: dict[str, Counter[str]] = {
        p: Counter()
        for p in ("renewals", "long polls", "takeovers", "reports", "layout", "job queues")
    }
    hold, _ = lease_timing(fleet.lease_seconds)  # a renewal hides for a hold
    renewal_vts = {math.ceil(hold), math.ceil(int(hold * 1.5))}  # the second: the presence's
    for key, n in counts.items():
        queue, _, what = key.partition(" ")
        if queue == leases:
            if what in {f"ChangeMessageVisibilityBatch:vt={vt}" for vt in renewal_vts}:
                part = "renewals"
            elif what.startswith("ReceiveMessage:empty"):
                part = "long polls"
            else:
                part = "takeovers"
        elif queue == state:
            part = "reports"
        elif queue == layout:
            part = "layout"
        elif queue.startswith(fleet.prefix):
            part = "job queues"
        else:
            continue
        out[part][what] += n
    return out


def expected(fleet: Fleet) -> dict[str, float]:
    """Requests per hour the design predicts for a settled idle fleet."""
    per_node = math.ceil(fleet.total_shards / fleet.nodes)
    # leases + the presence, which rides along, or every other round if they fill batches
    renew_each = per_node / 10 + 0.5 if per_node % 10 == 0 else math.ceil((per_node + 1) / 10)
    idle_every = 90.0 if not fleet.static else fleet.report_seconds  # an idle elastic node
    report_every = idle_every * (0.85 + 1.0) / 2  # x uniform(0.85, 1)
    _, renew = lease_timing(fleet.lease_seconds)
    leased = 0 if fleet.static else fleet.nodes  # static nodes hold no leases
    return {
        "renewals": leased * renew_each * 3600 / renew,
        "long polls": leased * 3600 / 20,  # one 20 s long poll at a time
        "takeovers": 0.0,
        "reports": fleet.nodes * 3 * 3600 / report_every,
        "layout": fleet.nodes * 3600 / 300,  # a look at the layout every 5 minutes
        "job queues": fleet.total_shards * 3600 / 20,
    }


def run_cost(args: argparse.Namespace) -> int:
    print(f"shardq elastic fleet, idle cost  git {git_head()}")
    print(f"lease_seconds {args.lease_seconds}, report_seconds {args.report_seconds}")
    if args.static:
        print("static nodes: shardq run --node N --nodes M (no leases, reports only)")
    print(f"machine: {machine()}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="fleet-cost-") as tmp,
        emulator_and_proxy(True) as (direct, proxied),
    ):
        fleets = [start_fleet(n, w, s, proxied, Path(tmp), args) for n, w, s in args.fleet]
        try:
            start = time.monotonic()
            for fleet in fleets:
                wait_until(f"fleet {fleet.name} settling", lambda f=fleet: settled(f, direct), 300)
                print(
                    f"fleet {fleet.name} ({fleet.prefix}) settled (as its document shows)"
                    f" {time.monotonic() - start:.0f} s after the start"
                )
            print(f"settled; {args.settle:.0f} s more before counting", flush=True)
            time.sleep(args.settle)
            for fleet in fleets:
                for proc in fleet.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"a node of {fleet.name} exited: {proc.returncode}")
            before, t0 = queue_counts(proxied), time.monotonic()
            print(f"counting for {args.minutes:g} min; machine: {machine()}", flush=True)
            time.sleep(args.minutes * 60)
            after, hours = queue_counts(proxied), (time.monotonic() - t0) / 3600
            print(f"counted {hours * 60:.2f} min; machine: {machine()}")
            for fleet in fleets:
                still = settled(fleet, direct)
                report(fleet, parts(fleet, after - before), hours, still)
        finally:
            for fleet in fleets:
                for proc in fleet.procs:
                    stop(proc)
            keep_logs(args, fleets)
    return 0


def keep_logs(args: argparse.Namespace, fleets: list[Fleet]) -> None:
    if args.keep_logs:
        kept = Path(tempfile.mkdtemp(prefix="fleet-logs-"))
        for fleet in fleets:
            for log in fleet.logs:
                log.rename(kept / log.name)
        print(f"node logs kept in {kept}")


def report(fleet: Fleet, by_part: dict[str, Counter[str]], hours: float, still: bool) -> None:
    n, s = fleet.nodes, fleet.total_shards
    model = expected(fleet)
    per_hour = {p: sum(c.values()) / hours for p, c in by_part.items()}
    fleet_total = sum(v for p, v in per_hour.items() if p != "job queues")
    bound = BOUND_PER_SHARD * s + BOUND_PER_NODE * n
    node_part = sum(per_hour[p] for p in ("long polls", "reports", "takeovers", "layout"))
    rows = [
        [p, f"{v:,.0f}", f"{model[p]:,.0f}", f"{v / n:,.1f}", f"{v / s:,.1f}"]
        for p, v in per_hour.items()
    ]
    print(f"\n== fleet {fleet.name}: {n} nodes, {fleet.workers} workers x {fleet.shards} shards")
    print(f"   still settled at the end: {'yes' if still else 'NO'}")
    print(table(["part", "req/h", "design", "per node-h", "per shard-h"], rows))
    for p, c in by_part.items():
        print(f"   {p}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print(
        f"   fleet (leases + fleet queues): {fleet_total:,.0f} req/h; bound 40 x {s} + 360 x {n}"
        f" = {bound:,}: {'MEETS' if fleet_total <= bound else 'MISSES'}"
    )
    print(
        f"   per node-hour (long polls + reports + takeovers + layout): {node_part / n:,.1f}"
        f" (<= 360:"
        f" {'yes' if node_part / n <= BOUND_PER_NODE else 'no'}); per shard-hour (renewals):"
        f" {per_hour['renewals'] / s:,.1f} (<= 40:"
        f" {'yes' if per_hour['renewals'] / s <= BOUND_PER_SHARD else 'no'})"
    )
    print(f"   job-queue idle polls: {per_hour['job queues'] / s:,.1f} per shard-hour", flush=True)


# -- the kill scenario -------------------------------------------------------------------
def cli_nodes(env: dict[str, str]) -> dict[str, Any] | None:
    done = subprocess.run(
        [sys.executable, "-m", "shardq", "nodes", "--json"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


def api_nodes(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/nodes", timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except OSError:
        return None


def shown(view: dict[str, Any] | None, victim: str, keys: set[str]) -> tuple[bool, bool]:
    """(the victim is listed gone, every key is held by a live node other than it)."""
    if view is None:
        return False, False
    gone = any(g["node"] == victim for g in view["gone"])
    held = {k for n in view["nodes"] if n["node"] != victim for k in n["held"]}
    return gone, keys <= held


def log_events(logs: list[Path], name: str) -> list[dict[str, Any]]:
    """The ``name`` events of these JSON log files, each with ``t`` (Unix seconds)."""
    from datetime import datetime

    out = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                event["t"] = datetime.fromisoformat(event["timestamp"]).timestamp()
                out.append(event)
    return out


def from_logs(logs: list[Path], node: str, keys: set[str], since: float) -> dict[str, float]:
    """From ``since``: the first ``fleet.node_gone`` of ``node`` and the last
    ``fleet.took`` of ``keys`` in these logs (when every key was taken)."""
    times = {}
    gone = [
        e["t"]
        for e in log_events(logs, "fleet.node_gone")
        if e.get("node") == node and e["t"] >= since
    ]
    if gone:
        times["first fleet.node_gone in the others' logs"] = min(gone) - since
    took: dict[str, float] = {}
    for e in log_events(logs, "fleet.took"):
        if e.get("shard") in keys and e["t"] >= since:  # the first take of each
            took[e["shard"]] = min(e["t"], took.get(e["shard"], e["t"]))
    if set(took) == keys:
        times["last of its shards taken (fleet.took in the others' logs)"] = (
            max(took.values()) - since
        )
    return times


def run_kill(args: argparse.Namespace) -> int:
    print(f"shardq elastic fleet: kill -9 of one node of 3, then a graceful stop  git {git_head()}")
    print(f"lease_seconds {args.lease_seconds}, report_seconds {args.report_seconds}")
    print(f"machine: {machine()}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="fleet-kill-") as tmp,
        emulator_and_proxy(False) as (direct, _),
    ):
        fleet = start_fleet(3, 3, 8, direct, Path(tmp), args)
        from tests.emulator import free_port

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        dash = subprocess.Popen(
            [sys.executable, "-m", "shardq", "dashboard", "--port", str(port)],
            cwd=HERE,
            env=fleet.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            took = wait_until("the fleet settling", lambda: settled(fleet, direct), 300)
            print(f"settled in {took:.0f} s; dashboard at {url}", flush=True)
            time.sleep(args.settle)
            killed = leave(fleet, 0, signal.SIGKILL, direct, url, args.screenshot)
            if args.then_stop:
                wait_until("rebalancing", lambda: settled(fleet, direct, 2), 300, every=0.5)
                print(f"balanced over the 2 others (as reported) {time.time() - killed:.1f} s")
                time.sleep(args.settle)
                leave(fleet, 1, signal.SIGTERM, direct, url, None)
        finally:
            stop(dash)
            for proc in fleet.procs:
                stop(proc)
            keep_logs(args, [fleet])
    return 0


def leave(
    fleet: Fleet, index: int, sig: int, direct: str, url: str, screenshot: Path | None
) -> float:
    """Send ``sig`` to node ``index``; print when the others show it gone and its shards
    held (``shardq nodes --json``, the dashboard, their logs)."""
    proc = fleet.procs[index]
    report = next(r for r in fleet_doc(direct, fleet.prefix).nodes.values() if r.pid == proc.pid)
    keys = set(report.held)
    what = "kill -9" if sig == signal.SIGKILL else "SIGTERM"
    print(f"\n{what} {report.node}, holding {len(keys)} shards: {sorted(keys)}", flush=True)
    sent = time.time()
    os.kill(proc.pid, sig)
    code = proc.wait(120)
    times = {f"the process exited ({code})": time.time() - sent}
    times.update(watch(fleet.env, url, report.node, keys, sent, screenshot))
    others = [log for i, log in enumerate(fleet.logs) if i != index]
    times.update(from_logs(others, report.node, keys, sent))
    rows = [[k, f"{v:.1f}"] for k, v in sorted(times.items(), key=lambda kv: kv[1])]
    print(table([f"from the {what} to", "seconds"], rows))
    final = cli_nodes(fleet.env)
    if final is not None:
        for n in final["nodes"]:
            print(f"  live {n['node']}: {len(n['held'])} shards")
        for g in final["gone"]:
            print(f"  gone {g['node']}: {g['reason']}, unserved {g['unserved']}")
    return sent


def watch(
    env: dict[str, str],
    url: str,
    victim: str,
    keys: set[str],
    killed: float,
    screenshot: Path | None,
) -> dict[str, float]:
    """Poll ``shardq nodes --json`` and the dashboard until both show the victim gone and
    its shards held by others (at most 3 minutes); the times from ``killed``."""
    times: dict[str, float] = {}
    labels = [
        ("cli", 0, "`shardq nodes` shows it gone"),
        ("cli", 1, "`shardq nodes` shows its shards held by others"),
        ("api", 0, "the dashboard shows it gone"),
        ("api", 1, "the dashboard shows its shards held by others"),
    ]
    while len(times) < len(labels) and time.time() - killed < 180:
        views = {"cli": cli_nodes(env), "api": api_nodes(url)}
        now = time.time() - killed
        for source, index, label in labels:
            if label not in times and shown(views[source], victim, keys)[index]:
                times[label] = now
                print(f"  {now:5.1f} s: {label}", flush=True)
        time.sleep(0.5)
    if screenshot is not None and all(label in times for *_, label in labels[2:]):
        save_screenshot(url, screenshot)
        print(f"screenshot {screenshot}")
    return times


def save_screenshot(url: str, path: Path) -> None:
    """The dashboard, full height at 1400 px wide, in headless chromium."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    profile = tempfile.mkdtemp(prefix="shardq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url)
        WebDriverWait(driver, 20).until(
            lambda d: d.execute_script(
                "return !!document.querySelector('#nodes tr.gone')"
                " && !document.getElementById('fleet-banner').hidden"
            )
        )
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
        )
        time.sleep(0.5)
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("cost", "kill"), default="cost")
    parser.add_argument(
        "--fleet",
        type=parse_fleet,
        action="append",
        metavar="NxWxS",
        help="N nodes, W workers of S shards (repeatable; default 3x3x8, 3x3x100, 1x1x8)",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="idle minutes counted (10)")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds after settling before counting (60)"
    )
    parser.add_argument(
        "--lease-seconds", type=int, default=30, help="the nodes' lease_seconds (30, the default)"
    )
    parser.add_argument(
        "--report-seconds", type=int, default=45, help="the nodes' report_seconds (45, the default)"
    )
    parser.add_argument(
        "--static", action="store_true", help="cost: static nodes (--node N --nodes M) instead"
    )
    parser.add_argument("--screenshot", type=Path, help="kill: save the dashboard here")
    parser.add_argument(
        "--then-stop",
        action="store_true",
        help="kill: then stop a second node with SIGTERM and time its handover",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the node logs")
    args = parser.parse_args()
    args.fleet = args.fleet or [(3, 3, 8), (3, 3, 100), (1, 1, 8)]
    if args.static and args.scenario == "kill":
        parser.error("--static is for the cost scenario")
    return run_kill(args) if args.scenario == "kill" else run_cost(args)


if __name__ == "__main__":
    sys.exit(main())
