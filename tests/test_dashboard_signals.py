"""The dashboard process and its stop signals: the first stops it cleanly, a second one
(while it is still stopping) ends it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# A dashboard whose stop hangs, so that the second signal is what ends it.
SCRIPT = """\
import sys, time
import shardq
from shardq.broker import MemoryBroker
from shardq.ops import dashboard

def hanging_stop(self):
    print("stopping", flush=True)
    time.sleep(60)

dashboard.DashboardServer.stop = hanging_stop
app = shardq.App(broker=MemoryBroker())
dashboard.serve(app, port=0, refresh=0.2)
print("returned", flush=True)
"""


def _read_until(child: subprocess.Popen[str], text: str, seconds: float) -> str:
    assert child.stdout is not None
    deadline, line = time.monotonic() + seconds, ""
    while text not in line and time.monotonic() < deadline:
        line = child.stdout.readline()
    return line


def test_a_second_signal_while_the_dashboard_stops_exits_at_once() -> None:
    # given a dashboard process that serves
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert "dashboard.started" in _read_until(child, "dashboard.started", 20)
        # when a first SIGTERM starts its stop (which hangs here)
        os.kill(child.pid, signal.SIGTERM)
        assert "stopping" in _read_until(child, "stopping", 20)
        # and a second one comes
        os.kill(child.pid, signal.SIGINT)
        # then it exits at once with the shell's code for that signal, not after the stop
        rest = child.communicate(timeout=20)[0]
        assert child.returncode == 128 + signal.SIGINT
        assert "returned" not in rest
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
