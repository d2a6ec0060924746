"""The examples run as written."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_applies_each_orders_updates_in_order() -> None:
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "order-42 created -> paid -> shipped" in result.stdout
    assert "order-7 created -> paid -> shipped" in result.stdout


def example_env(**extra: str) -> dict[str, str]:
    """The environment without stray SHARDQ_* settings, writing no bytecode into the repo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", **extra}


def run_example(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` from the repository root, as the READMEs say; it must exit 0."""
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


RUN_UNTIL_EMPTY = ("run", "--until-empty", "--log-level", "warning")


def test_django_style_middleware_closes_the_db_connection_after_each_job(
    tmp_path: Path,
) -> None:
    manage = "examples/django_style/manage.py"
    env = example_env(SHOP_DATA_DIR=str(tmp_path))
    seeded = run_example(manage, "seed", "--orders", "5", env=env)
    assert "published 15 status changes for 5 orders" in seeded.stdout
    ran = run_example(manage, "shardq_run", "--until-empty", "--log-level", "warning", env=env)
    assert "20 jobs succeeded" in ran.stderr  # 15 UpdateOrderStatus + 5 NotifyCustomer
    assert "db connections: 20 opened, 20 closed, 0 left open" in ran.stdout

    with closing(sqlite3.connect(tmp_path / "shop.sqlite3")) as db:
        orders = db.execute("SELECT id, status FROM shop_order ORDER BY id").fetchall()
        events = db.execute("SELECT order_id, status FROM shop_orderevent ORDER BY id").fetchall()
        outbox = db.execute("SELECT customer, message FROM shop_outbox").fetchall()
        serials = [
            row[0]
            for table in ("shop_orderevent", "shop_outbox")
            for row in db.execute(f"SELECT connection FROM {table}")
        ]
    assert orders == [(f"order-{n}", "shipped") for n in range(1, 6)]
    for n in range(1, 6):
        assert [s for o, s in events if o == f"order-{n}"] == ["created", "paid", "shipped"]
    assert sorted(outbox) == sorted(
        (f"customer-{n % 3}", f"order-{n} is on its way") for n in range(1, 6)
    )
    # every job ran on a connection of its own: none was reused by a later job
    assert sorted(serials) == list(range(1, 21))
    shown = run_example(manage, "show", env=env)
    assert "order-3: shipped (3 updates)" in shown.stdout

    # without the middleware, the threads that ran jobs (4 receiving threads, which run
    # quick jobs themselves, and 2 execution slots) keep their first connection open
    env = example_env(
        SHOP_DATA_DIR=str(tmp_path / "without"),
        SHOP_CLOSE_DB_CONNECTIONS="0",
        SHARDQ_CONCURRENCY="2",
    )
    run_example(manage, "seed", "--orders", "5", env=env)
    ran = run_example(manage, "shardq_run", "--until-empty", "--log-level", "warning", env=env)
    counts = re.search(r"db connections: (\d+) opened, (\d+) closed, (\d+) left open", ran.stdout)
    assert counts, ran.stdout
    opened, closed, left = map(int, counts.groups())
    assert 1 <= opened <= 4 + 2 and closed == 0 and left == opened  # 6 threads, 20 jobs


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def test_web_publisher_publishes_valid_requests_and_refuses_bad_ones(tmp_path: Path) -> None:
    env = example_env(
        WEB_PUBLISHER_DIR=str(tmp_path), SHARDQ_BROKER_URL=f"sqlite:///{tmp_path / 'broker.db'}"
    )
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "examples.web_publisher.server", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 15)
        line = server.stdout.readline() if ready else ""
        found = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert found, f"server did not start: {line!r} {(tmp_path / 'server.log').read_text()}"
        base = found.group(1)

        accepted = [
            post(f"{base}/orders/order-42/status", b'{"status": "paid"}'),
            post(f"{base}/orders/order-42/status", b'{"status": "shipped"}'),
            post(f"{base}/orders/order-7/status", b'{"status": "paid", "by": "bob"}'),
        ]
        assert [code for code, _ in accepted] == [202, 202, 202]
        assert [doc["order_id"] for _, doc in accepted] == ["order-42", "order-42", "order-7"]
        assert len({doc["message_id"] for _, doc in accepted}) == 3

        key = {"Idempotency-Key": "req-1"}
        once = post(f"{base}/orders/order-9/status", b'{"status": "paid"}', key)
        again = post(f"{base}/orders/order-9/status", b'{"status": "paid"}', key)
        assert once[0] == again[0] == 202 and once[1]["message_id"] == again[1]["message_id"]

        code, doc = post(f"{base}/orders/order%2013/status", b'{"status": "paid"}')
        assert code == 400 and "entity id 'order 13' contains ' '" in doc["error"]
        code, doc = post(f"{base}/orders/order-13/status", b'{"status": ')
        assert code == 400 and doc["error"].startswith("body is not JSON")
        code, doc = post(f"{base}/orders/order-13/status", b'{"status": "paid", "n": NaN}')
        assert code == 400 and "is not JSON-serialisable" in doc["error"]
        big = json.dumps({"status": "paid", "blob": "x" * 1_100_000}).encode()
        code, doc = post(f"{base}/orders/order-13/status", big)
        assert code == 400 and "accepts at most" in doc["error"]
    finally:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()

    ran = run_example(
        "-m", "shardq", *RUN_UNTIL_EMPTY, "--app", "examples.web_publisher.tasks", env=env
    )
    assert "4 jobs succeeded" in ran.stderr  # the refused ones were never published
    with closing(sqlite3.connect(tmp_path / "orders.db")) as db:
        rows = db.execute("SELECT order_id, status, history FROM orders ORDER BY 1").fetchall()
    assert rows == [
        ("order-42", "shipped", "paid -> shipped"),
        ("order-7", "paid", "paid"),
        ("order-9", "paid", "paid"),
    ]
    shown = run_example("-m", "examples.web_publisher.tasks", env=env)
    assert "order-42: paid -> shipped" in shown.stdout


def test_order_sync_merges_bursts_into_few_writes_ending_in_the_last_status(
    tmp_path: Path,
) -> None:
    env = example_env(
        ORDER_SYNC_DIR=str(tmp_path), SHARDQ_BROKER_URL=f"sqlite:///{tmp_path / 'broker.db'}"
    )
    published = run_example(
        "-m", "examples.order_sync.publish", "--orders", "10", "--bursts", "3", env=env
    )
    found = re.search(r"published (\d+) updates of 10 orders", published.stdout)
    assert found, published.stdout
    updates = int(found.group(1))
    assert updates >= 60

    ran = run_example(
        "-m", "shardq", *RUN_UNTIL_EMPTY, "--app", "examples.order_sync.orders", env=env
    )
    assert f"{updates} jobs succeeded" in ran.stderr
    writes = re.findall(
        r"(order-\d+): merged (\d+) updates? into 1 write -> v(\d+) (\w+)", ran.stdout
    )
    assert sum(int(n) for _, n, _, _ in writes) == updates
    assert max(int(n) for _, n, _, _ in writes) == 10  # batch_size
    assert len(writes) <= updates // 3  # many updates, few writes

    with closing(sqlite3.connect(tmp_path / "orders.db")) as db:
        stored = db.execute("SELECT order_id, version, status, writes FROM orders").fetchall()
        last = db.execute("SELECT order_id, version, status FROM published").fetchall()
    assert sorted((o, v, s) for o, v, s, _ in stored) == sorted(last)
    assert sum(w for *_, w in stored) == len(writes)
    final = {order: (int(v), status) for order, _, v, status in writes}  # each order's last write
    assert sorted((o, v, s) for o, (v, s) in final.items()) == sorted(last)

    report = run_example("-m", "examples.order_sync.report", env=env)
    assert (
        f"{updates} updates published, {updates} applied in {len(writes)} writes" in report.stdout
    )
    assert "10 of 10 orders hold their last published status" in report.stdout
