"""The one handler of stop signals: the node, the dashboard and ``publish --file`` use it."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import shardq
from shardq.broker.sqlite import SqliteBroker
from shardq.core.config import Config
from shardq.core.signals import STOP_SIGNALS, StopSignals


def test_the_first_signal_asks_to_stop_a_second_calls_again_and_restore_gives_them_back() -> None:
    # given a handler of SIGUSR1 whose second signal is recorded instead of exiting
    def before(_signum: int, _frame: object) -> None: ...

    previous = signal.signal(signal.SIGUSR1, before)
    seconds: list[int] = []
    stop = StopSignals(threading.Event(), (signal.SIGUSR1,), again=seconds.append)
    try:
        with stop.installed():
            # when the signal comes once
            signal.raise_signal(signal.SIGUSR1)
            # then stopping is asked, naming the signal, and nothing else happens
            assert stop.stopping.is_set() and stop.name == "SIGUSR1"
            assert seconds == []
            # when it comes again, then `again` gets it
            signal.raise_signal(signal.SIGUSR1)
            assert seconds == [signal.SIGUSR1]
        # and once out of the block, the handler from before is back
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_signals_that_came_before_install_count_and_other_threads_install_nothing() -> None:
    # given one signal already seen by an earlier handler
    seconds: list[int] = []
    stop = StopSignals(threading.Event(), (signal.SIGUSR2,), again=seconds.append)
    previous = signal.getsignal(signal.SIGUSR2)
    # when a thread that is not the main one installs it, then no handler changes
    worker = threading.Thread(target=stop.install, args=(1,))
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGUSR2) is previous and stop.count == 1
    # when the main thread installs it with that count, the next signal is a second one
    try:
        stop.install(before=1)
        signal.raise_signal(signal.SIGUSR2)
        assert seconds == [signal.SIGUSR2]
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGUSR2) is previous


def test_a_node_run_from_code_in_the_main_thread_gives_the_stop_signals_back(
    tmp_path: Path,
) -> None:
    # given a program with its own handlers of SIGTERM and SIGHUP (SIGINT: Python's)
    def own(_signum: int, _frame: object) -> None: ...

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, own)
    app = shardq.App(Config(queue_prefix="sig-"), broker=SqliteBroker(str(tmp_path / "q.db")))

    @app.register
    class Noop(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[object]) -> None: ...

    app.ensure_queues()
    Noop.publish("e", {"n": 1})
    try:
        # when it runs a node in its main thread until the work is done
        assert app.node(app.plan(threads=1), until_empty=True).run() == 0
        # then its handlers are back: a Ctrl-C after the node is Python's again
        assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGHUP) is own
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        app.broker.close()
