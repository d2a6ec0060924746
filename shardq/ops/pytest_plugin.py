"""The pytest plugin shipped with shardq (registered as ``shardq`` in ``pytest11``).

Fixtures:

* ``shardq_testing``: call it with your app to run the test on a fresh in-memory
  broker; returns a :class:`shardq.ops.testing.Harness` (``.drain()``, ``.eager()``,
  ``.broker``). The app's config and broker are restored after the test.
* ``shardq_memory_broker``: a bare :class:`shardq.MemoryBroker`, closed after the test.
"""

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
