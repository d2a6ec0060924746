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
from tests.takeover import KILL, figures

pytestmark = pytest.mark.slow

#: 3 processes (2 splitting the shards + 1 owning them all), 100 entities x 10 jobs,
#: 10 % of attempts failing, 2 % of jobs failing for good, a kill every 1-3 s for 16 s.
#: Jobs are hidden 5 s per receive (not 2): on a loaded machine a node process can stall
#: for seconds, and then the run would be about lapsed extensions, not about kills.
SMALL = chaos.Settings(entities=100, duration=16.0, sleep=0.02, visibility_timeout=5)

#: shardq's fleet still lets a dead node's shard wait longer than lease_seconds + 10 s
#: in some interleavings (RELIABILITY.md, "Elastic fleet"): such a run is reported as
#: an expected failure, while every other check stays strict. Set to False once fixed.
TAKEOVER_DELAYS_KNOWN = False

#: An elastic fleet of 3 nodes (1 to 4 alive) over 6 shards, lease timeout 10 s,
#: reports every 5 s (both the least shardq allows); 360 jobs of 60 entities; an event
#: every 2-3.5 s for 27 s (about 10 events, as many as every 3-6 s for 45 s).
ELASTIC = chaos.Settings(
    layout="elastic",
    nodes=3,
    max_nodes=4,
    shards=6,
    entities=60,
    jobs=6,
    burst=3,
    sleep=0.02,
    duration=27.0,
    event_every=(2.0, 3.5),
    publish_share=0.9,
    lease_seconds=10,
    report_seconds=5,
    visibility_timeout=5,  # as SMALL's
)


# On the embedded broker, the run with reopening message groups below makes the same
# checks: that broker is the embedded one plus one defect, so shardq's path is the same.
@pytest.mark.sqs
@pytest.mark.parametrize("env", ["sqs"], indirect=True)
def test_nodes_killed_at_random_lose_nothing_and_keep_every_entity_in_order(
    env: Env, tmp_path: Path
) -> None:
    # given 3 node processes over the same shards, and 1,000 numbered jobs of 100
    # entities published in bursts while they run, some failing at random, some for good
    settings = SMALL
    # when a random node is killed with SIGKILL (and restarted) every 1-3 s for 16 s,
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
    # then the kills happened while jobs ran, and failures were retried
    assert report.kills >= 5 and report.failed_attempts > 0
    assert report.published == SMALL.entities * SMALL.jobs
    # and nothing was lost, reordered or run twice at once; a job ran twice only after
    # its node was killed; every job failing for good, and only those, is in the
    # morgue; every node stopped cleanly at the end
    assert report.ok, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent > 0


# On the embedded broker, the run that hides visible-again messages below makes the
# same checks: that broker is the embedded one plus one quirk, so shardq's path is the same.
@pytest.mark.sqs
@pytest.mark.parametrize("env", ["sqs"], indirect=True)
def test_an_elastic_fleet_loses_nothing_while_nodes_die_join_and_stop_and_takes_over_in_time(
    env: Env, tmp_path: Path
) -> None:
    # given 3 elastic node processes (no --node) sharing 6 shards by leases, and 360
    # numbered jobs of 60 entities published while they run, some failing
    settings = ELASTIC
    # when, every 2-3.5 s for 27 s, a node is killed (not restarted), a new node joins
    # or a node is stopped gracefully, and the fleet then drains the queues
    report = chaos.run(settings, dict(env.vars), tmp_path / "chaos")
    print(report.summary())
    # then nodes were killed, joined and stopped while jobs ran and failed
    assert report.kills >= 1 and report.joins >= 1 and report.stops >= 1
    assert report.failed_attempts > 0
    assert report.published == settings.entities * settings.jobs
    # and the dead nodes' shards were taken over (measured from the ledger)
    assert figures(report.takeovers, KILL).count >= 1
    # and nothing was lost, reordered or run twice at once; a job ran twice only
    # after a kill; every stopped node exited 0
    assert report.safe, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent > 0
    # and every dead node's shards were served again within lease_seconds + 10 s
    if report.problems["slow_takeover"] and TAKEOVER_DELAYS_KNOWN:
        pytest.xfail("known takeover delays (RELIABILITY.md): " + report.details())
    assert report.ok, report.summary() + "\n" + report.details()


def test_an_elastic_fleet_keeps_every_shard_served_on_a_broker_that_hides_visible_again_messages(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given the elastic run on a broker that keeps a message whose visibility ran out
    # hidden while an older message of its queue is in flight (as an SQS emulator
    # many teams use in CI does); the fleet keeps no state in messages
    env = Env("sqlite-stale", tmp_path, request)
    ledger.app.configure(env.config())
    try:
        # when nodes die, join and stop while jobs flow and fail
        report = chaos.run(ELASTIC, dict(env.vars), tmp_path / "chaos")
    finally:
        env.stop_all()
        ledger.app.broker.close()
    print(report.summary())
    # then nodes were killed, joined and stopped while jobs ran and failed
    assert report.kills >= 1 and report.joins >= 1 and report.stops >= 1
    assert report.failed_attempts > 0
    assert report.published == ELASTIC.entities * ELASTIC.jobs
    # and the dead nodes' shards were taken over in time; nothing was lost, reordered
    # or run twice at once; the jobs failing for good, and only those, are in the morgue
    assert figures(report.takeovers, KILL).count >= 1
    assert report.ok, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent > 0
