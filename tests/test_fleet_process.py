"""An elastic node (`shardq run` without --node) as a real child process."""

from __future__ import annotations

import signal

import pytest

from shardq.errors import QueueNotFoundError
from shardq.fleet import leases_queue
from tests.apps import ledger
from tests.children import Env

pytestmark = pytest.mark.slow


def test_a_node_stopped_gracefully_leaves_every_shard_lease_receivable_at_once(env: Env) -> None:
    # given one elastic node holding every shard lease (3 shards) and its presence
    node = env.node("--threads", "1")
    queue = leases_queue(env.config().queue_prefix)
    broker = ledger.app.broker

    def holding_all() -> bool:
        try:
            counts = broker.counts(queue)
        except QueueNotFoundError:  # the node has not created it yet
            return False
        return (counts.waiting, counts.in_flight) == (0, 4)

    env.wait_for(holding_all)
    # when it gets SIGTERM and exits
    node.send_signal(signal.SIGTERM)
    assert node.wait(30) == 0

    # then every shard lease is visible again within a few seconds (a lease received
    # while stopping is handed back after a second), none left in flight for the
    # 30 s of a lease; its presence is deleted
    def receivable() -> bool:
        counts = broker.counts(queue)
        return (counts.waiting, counts.in_flight) == (3, 0)

    env.wait_for(receivable, timeout=3)
