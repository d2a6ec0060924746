"""The chaos suite, small: node processes killed at random while numbered jobs flow.

See ``tests/chaos.py`` for what a run does and checks, ``bench/chaos.py`` for the
large version and RELIABILITY.md for its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import chaos
from tests.apps import ledger
from tests.children import Env

pytestmark = pytest.mark.slow

#: 3 processes (2 splitting the shards + 1 owning them all), 150 entities x 10 jobs,
#: 10 % of attempts failing, 2 % of jobs failing for good, a kill every 1-3 s for 25 s.
SMALL = chaos.Settings(duration=25.0, sleep=0.02)


def test_nodes_killed_at_random_lose_nothing_and_keep_every_entity_in_order(
    env: Env, tmp_path: Path
) -> None:
    # given 3 node processes over the same shards, and 1,500 numbered jobs of 150
    # entities published in bursts while they run, some failing at random, some for good
    settings = SMALL
    # when a random node is killed with SIGKILL (and restarted) every 1-3 s for 25 s,
    # and the nodes then drain the queues
    report = chaos.run(settings, dict(env.vars), tmp_path / "chaos")
    print(report.summary())
    # then the kills happened while jobs ran, and failures were retried
    assert report.kills >= 5
    assert report.failed_attempts > 0
    assert report.published == settings.entities * settings.jobs
    # and nothing was lost, reordered or run twice at once; a job ran twice only
    # after its node was killed; every job failing for good, and only those, is in
    # the morgue; every node stopped cleanly at the end
    assert report.ok, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent > 0


def test_nodes_killed_at_random_keep_order_on_a_broker_that_reopens_message_groups(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given the same run on a broker with a FIFO defect some SQS emulators have: a
    # message group reopens when a later message of it is released while an earlier
    # one is hidden (shardq must not lean on the group staying blocked)
    env = Env("sqlite-reopen", tmp_path, request)
    ledger.app.configure(env.config())
    try:
        # when nodes are killed at random while jobs flow and fail
        report = chaos.run(SMALL, dict(env.vars), tmp_path / "chaos")
    finally:
        env.stop_all()
        ledger.app.broker.close()
    print(report.summary())
    # then nothing was lost, reordered or run twice at once
    assert report.kills >= 5 and report.failed_attempts > 0
    assert report.ok, report.summary() + "\n" + report.details()
