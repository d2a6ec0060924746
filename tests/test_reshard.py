"""Resharding a live worker, end to end: 8 -> 16 -> 5 shards while jobs flow and nodes die.

The chaos driver (``tests/chaos.py`` with ``Settings.reshards``, see
``tests/chaos_reshard.py``) runs elastic ``shardq run`` processes and a publisher
process; each reshard is a ``shardq reshard`` child process. ``bench/reshard.py`` is
the large version; RELIABILITY.md, "Resharding a live worker", has its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.ops.ensure import ensure_state_table
from tests import chaos
from tests.apps import ledger
from tests.chaos_reshard import IN_PROGRESS
from tests.children import Env

pytestmark = pytest.mark.slow

#: 2 elastic nodes over 8 shards, 800 numbered jobs of 80 entities published by a
#: child process over ~32 s, 10 % of attempts failing at random, 2 % of jobs for good;
#: reshards to 16 shards once both nodes serve (2 s in at the soonest) and to 5 as soon
#: as that one ended (its command SIGKILLed as soon as it began); a busy node SIGKILLed
#: 2 s into each, and a new one joining. Publishers re-read the layout every 0.5 s and
#: switch 6 s after a start; old shards close 5 s after that at the soonest; a dead
#: node's leases lapse after 10 s, so each reshard takes ~20 s and the run ~45 s.
SMALL = chaos.Settings(
    layout="elastic",
    nodes=2,
    max_nodes=4,
    shards=8,
    entities=80,
    jobs=10,
    burst=2,
    sleep=0.01,
    duration=36.0,
    publish_share=0.9,
    publisher="process",
    reshards=((2.0, 16), (2.0, 5)),
    kill_reshard_command=(1,),
    layout_refresh_seconds=0.5,
    reshard_trust_seconds=6.0,
    lease_seconds=10,
    report_seconds=5,
)


def test_a_worker_resharded_twice_while_jobs_flow_and_nodes_die_loses_and_reorders_nothing(
    env: Env, tmp_path: Path
) -> None:
    # given a worker with 8 shards, 2 elastic nodes, and a publisher process sending
    # numbered jobs of 80 entities with dedup ids, 10 % of attempts failing
    settings = SMALL
    # when the worker is resharded to 16 shards and then to 5 by `shardq reshard`
    # while the publisher goes on, a busy node is SIGKILLed during each reshard (and
    # a new one joins), the second command is SIGKILLed as soon as it began, and the
    # nodes then drain every queue of the live layout
    ensure_state_table(ledger.app)  # the DynamoDB table on ministack
    report = chaos.run(settings, dict(env.vars), tmp_path / "chaos")
    print(report.summary())
    # then both reshards ended, each with a node killed during it
    assert [(r.from_shards, r.to_shards) for r in report.reshards] == [(8, 16), (16, 5)]
    assert all(r.seconds is not None and r.node_killed for r in report.reshards)
    assert report.reshards[0].command_code == 0
    assert report.reshards[1].command_killed  # the nodes finished that one alone
    assert report.failed_attempts > 0
    assert report.published == settings.entities * settings.jobs
    # and the layout document ended at generation 2 with 5 shards, no move under way
    assert report.final_layout == {"gen": 2, "shards": 5, "moving": False}
    # and a second `shardq reshard` during the first one was refused, saying why
    assert report.refusal is not None and report.refusal.code != 0
    assert IN_PROGRESS in report.refusal.output, report.refusal.output
    # and no job was left in a queue of generation 0 (8) or 1 (16): each is empty or gone
    assert len(report.old_queues) == 8 + 16
    assert all(not jobs for jobs in report.old_queues.values()), report.old_queues
    # and nothing was lost, reordered or run twice at once; a job ran twice only
    # after a kill; the jobs failing for good, and only those, are in the morgue;
    # every node stopped at the end exited 0
    assert report.ok, report.summary() + "\n" + report.details()
    assert report.morgued == report.permanent > 0
