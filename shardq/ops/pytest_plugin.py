"""shardq's pytest plugin (``pytest11`` entry ``shardq``): ``shardq_testing(app)`` puts
the app on a fresh in-memory broker for the test and returns a
:class:`shardq.ops.testing.Harness`; ``shardq_memory_broker`` is a bare MemoryBroker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from shardq.api.app import App
from shardq.broker import MemoryBroker
from shardq.ops.testing import Harness


@pytest.fixture
def shardq_memory_broker() -> Iterator[MemoryBroker]:
    broker = MemoryBroker()
    yield broker
    broker.close()


@pytest.fixture
def shardq_testing() -> Iterator[Callable[[App], Harness]]:
    with ExitStack() as stack:

        def use(app: App) -> Harness:
            broker = MemoryBroker()
            stack.callback(broker.close)
            stack.enter_context(app.override(broker=broker))
            return Harness(app, broker)

        yield use
