"""``node.progress`` on a clock the test moves: when it is logged and what it says."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from shardq.broker import MemoryBroker
from shardq.core.clock import ManualClock
from shardq.core.config import Config
from shardq.core.outcome import Tally
from shardq.run.metrics import NodeMetrics
from tests.apps import ledger
from tests.clocks import Skipping


def test_progress_is_logged_once_per_period_with_the_rates_since_the_last_one() -> None:
    # given a node's counters and a progress log every 10 s on a manual clock
    clock, tally = ManualClock(), Tally()
    progress = NodeMetrics(
        lambda: [("Sync", 0, 1.5), ("Sync", 1, 4.25)],
        lambda: 7,
        slots=lambda: (3, 16),
        tally=lambda: tally,
        progress_seconds=10.0,
        clock=clock,
    )
    with capture_logs() as logs:
        # when 9.9 s pass: nothing is due yet
        tally.add("succeeded", "Sync", 50)
        clock.advance(9.9)
        progress.log_progress()
        assert logs == []
        # when the period is over: one line with the rate over the whole period
        clock.advance(0.1)
        progress.log_progress()
        progress.log_progress()  # and not twice for one period
        # and over the next period only what was done in it counts
        tally.add("succeeded", "Sync", 10)
        tally.add("morgued", "Sync", 10)
        clock.advance(20.0)
        progress.log_progress()
    # then
    assert [e["event"] for e in logs] == ["node.progress", "node.progress"]
    first, second = logs
    assert first["jobs_per_second"] == {"Sync": 5.0} and first["done"] == 50
    assert second["jobs_per_second"] == {"Sync": 1.0} and second["done"] == 70
    assert first["max_lag"] == 4.25 and first["held"] == 7
    assert (first["slots_in_use"], first["concurrency"]) == (3, 16)


def test_progress_every_0_is_never_logged() -> None:
    # given progress turned off (progress_seconds: 0)
    clock = ManualClock()
    progress = NodeMetrics(
        lambda: [], lambda: 0, slots=lambda: (0, 1), progress_seconds=0.0, clock=clock
    )
    # when a day passes
    with capture_logs() as logs:
        clock.advance(86_400)
        progress.log_progress()
    # then nothing was logged
    assert logs == []


def test_a_running_node_logs_progress_by_the_clock_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a node logging progress every hour, running on a clock the test moves
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    ledger.app.configure(Config(progress_seconds=3600), broker=MemoryBroker())
    clock = Skipping()
    node = ledger.app.node(ledger.app.plan(threads=1), clock=clock)
    runner = threading.Thread(target=node.run)
    with capture_logs() as logs:
        runner.start()
        try:
            # when an hour passes on its clock
            clock.offset += 3600
            # then it logs its progress within a few of its quarter-second looks
            deadline = time.monotonic() + 10
            while not any(e["event"] == "node.progress" for e in logs):
                assert time.monotonic() < deadline, "no node.progress"
                node.stopping.wait(0.05)
        finally:
            node.stop()
            runner.join(30)


def test_a_tally_counts_jobs_done_per_worker_and_their_rate_since_an_earlier_count() -> None:
    # given a tally of two workers' jobs, and its count of jobs done then
    tally = Tally()
    tally.add("succeeded", "Sync", 30)
    tally.add("morgued", "Sync", 2)
    tally.add("retried", "Mail", 5)
    before = tally.done()
    # when 16 more of Sync's jobs succeed and 4 of Mail's are morgued in 4 s
    tally.add("succeeded", "Sync", 16)
    tally.add("morgued", "Mail", 4)
    # then done counts succeeded and morgued jobs (not retried ones), and the rates are
    # per worker over those 4 s
    assert before == {"Sync": 32}
    assert tally.done() == {"Sync": 48, "Mail": 4}
    assert tally.rates(before, 4.0) == {"Sync": 4.0, "Mail": 1.0}
    # and a copy does not change with the tally
    copy = tally.copy()
    tally.add("succeeded", "Sync", 1)
    assert copy.done() == {"Sync": 48, "Mail": 4}
