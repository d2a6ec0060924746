from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from shardq.api.app import App
from shardq.broker import Broker, MemoryBroker, SqliteBroker
from shardq.ops.dashboard import DashboardServer
from shardq.ops.ensure import ensure_state_table
from shardq.run.node import Node
from tests import emulator as emu
from tests.apps import ledger
from tests.children import Env

# Properties are checked, never timed: on a loaded machine an example may take seconds
settings.register_profile("shardq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shardq")

# A dashboard a test stops stops within this (serving looks for stop() twice a second):
# no test depends on how long stopping takes, and ~100 tests stop one.
DashboardServer.poll_interval = 0.02
# An until-empty node run in a test's process asks whether it is drained after two idle
# looks of its loop 0.05 s apart, not 0.25 s: no test depends on that pace
Node.watch_seconds = 0.05

#: Modules whose tests run the longest scenarios (tens of seconds each), longest first:
#: they start before anything else.
LONGEST = ("test_reshard.py", "test_chaos.py", "test_outage.py", "test_reshard_skew.py")
#: Modules with tests of 10-20 s that are not marked ``slow``: started with those.
LONG = ("test_sqs_timeouts.py", "test_cli_ops.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the reshard and chaos scenarios (in LONGEST's order), then tests
    that start node processes (``slow``) or wait long (LONG), then those on the
    emulator (``sqs``), then the rest, each in collection order. With
    ``--maxschedchunk 1`` (pyproject), xdist hands the tests out one by one in this
    order, so no long test starts near the end of the run."""

    def cost(item: pytest.Item) -> int:
        if item.path.name in LONGEST:
            return LONGEST.index(item.path.name)
        if item.get_closest_marker("slow") or item.path.name in LONG:
            return len(LONGEST)
        return len(LONGEST) + (1 if item.get_closest_marker("sqs") else 2)

    items.sort(key=cost)  # stable: collection order within each class


@pytest.fixture(scope="session")
def sqs_emulator() -> Iterator[emu.Emulator]:
    """A ministack process on 127.0.0.1, shared by the session, stopped by its pid."""
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    server = emu.start()
    try:
        yield server
    finally:
        emu.stop(server)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def make_broker(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Broker:
    if kind == "sqlite":
        return SqliteBroker(str(tmp_path / "broker.db"))
    if kind == "sqlite-reopen":  # the embedded engine with a FIFO defect some emulators have
        return SqliteBroker(str(tmp_path / "broker.db"), reopen_groups=True)
    if kind == "sqlite-stale":  # hides a visible-again message behind an older in-flight one
        return SqliteBroker(str(tmp_path / "broker.db"), stale_visibility=True)
    if kind == "memory":
        return MemoryBroker()
    from shardq.broker.sqs import SqsBroker

    server = request.getfixturevalue("sqs_emulator")
    return SqsBroker(region="us-east-1", endpoint_url=server.endpoint_url)


BROKER_KINDS = [
    "sqlite",
    "memory",
    pytest.param("sqs", marks=pytest.mark.sqs),
]


@pytest.fixture(params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """Each broker implementation in turn: the contract tests run against all of them."""
    instance = make_broker(request.param, tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def queue_name() -> str:
    """A fresh FIFO queue name, so tests never share a queue on the emulator."""
    return f"t-{uuid.uuid4().hex[:16]}.fifo"


@pytest.fixture(params=["sqlite", pytest.param("sqs", marks=pytest.mark.sqs)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """Environment for child `shardq` processes on each broker, and the ledger app on it."""
    environment = Env(request.param, tmp_path, request)
    ledger.app.configure(environment.config())
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    yield environment
    environment.stop_all()
    ledger.app.broker.close()


def needs_shared_store(app: App) -> None:
    """Skip a test whose processes must share the app's state store, while its broker
    gets a store in memory (one per process); else make sure the store's table exists."""
    from shardq.store import MemoryStore

    if isinstance(app.store, MemoryStore):
        pytest.skip(f"the {app.broker.kind} broker's state store is in memory in each process")
    ensure_state_table(app)
