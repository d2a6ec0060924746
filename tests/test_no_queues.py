"""A queue_prefix with no queues (a typo) is said, not shown as all zeros."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from shardq.broker import MemoryBroker
from shardq.core.config import Config
from shardq.ops.dashboard import make_server
from tests.test_bad_input import shardq_cli
from tests.test_dashboard_methods import app


def broker_env(tmp_path: Path, prefix: str) -> dict[str, str]:
    return {
        "SHARDQ_BROKER_URL": f"sqlite:///{tmp_path / 'b.db'}",
        "SHARDQ_QUEUE_PREFIX": prefix,
    }


@pytest.mark.parametrize("command", [["stats"], ["stats", "--json"], ["nodes"]])
def test_a_prefix_with_no_queues_says_so_and_exits_2(tmp_path: Path, command: list[str]) -> None:
    # given an app whose queues exist under prefix prod-
    published = shardq_cli(
        "publish", "Ledgered", "e", '{"n": 0}', env=broker_env(tmp_path, "prod-")
    )
    assert published.returncode == 0, published.stderr
    # when stats or nodes is asked with a mistyped prefix
    result = shardq_cli(*command, env=broker_env(tmp_path, "prdo-"))
    # then it says no queue exists with that prefix and exits 2
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no queues of this app exist with queue_prefix 'prdo-'" in result.stderr
    assert "Traceback" not in result.stderr
    # and with the right prefix it exits 0
    assert shardq_cli(*command, env=broker_env(tmp_path, "prod-")).returncode == 0


def test_the_dashboard_says_when_there_are_no_queues() -> None:
    # given a dashboard on a broker with none of the app's queues
    app.configure(Config(queue_prefix="typo-"), broker=MemoryBroker())
    server = make_server(app, "127.0.0.1", 0, refresh=0.2).start()
    try:
        with urllib.request.urlopen(server.url + "api/v1/stats", timeout=30) as res:
            stats = json.loads(res.read())
        # then its stats carry the alert the page shows
        assert "no queues of this app exist with queue_prefix 'typo-'" in stats["no_queues"]
        # and once the queues exist, no alert
        app.ensure_queues()
        server.sampler.sample()
        with urllib.request.urlopen(server.url + "api/v1/stats", timeout=30) as res:
            assert json.loads(res.read())["no_queues"] is None
    finally:
        server.stop()
