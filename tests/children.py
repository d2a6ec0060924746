"""Child ``shardq`` processes sharing a broker with the test: environment and helpers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardq.core.config import Config

ROOT = Path(__file__).resolve().parent.parent


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: its SigCgt mask);
    False once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line for line in status.splitlines() if line.startswith("SigCgt:")), "")
    return bool(caught) and bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


def wait_catching(child: subprocess.Popen[bytes], signum: int, timeout: float = 30) -> None:
    """Wait until ``child`` has a handler for ``signum``: before that, it is still the
    bare interpreter starting, which any signal kills. Returns at once if it exited."""
    deadline = time.monotonic() + timeout
    while child.poll() is None and not catches(child.pid, signum):
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"process {child.pid} installed no handler for {signum} in {timeout:g} s"
            )
        time.sleep(0.01)


class Env:
    """Environment of the child nodes: broker, queue prefix and ledger."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.ledger = str(tmp_path / "ledger.jsonl")
        self.vars = {
            "LEDGER_PATH": self.ledger,
            "SHARDQ_QUEUE_PREFIX": f"p{uuid.uuid4().hex[:8]}-",
            "SHARDQ_IDLE_WAIT_SECONDS": "1",
            "SHARDQ_APP": "tests.apps.ledger",
            "SHARDQ_LOG_FORMAT": "json",
            "SHARDQ_CONCURRENCY": "8",  # entities of one shard at once
        }
        if kind == "sqlite":
            self.vars["SHARDQ_BROKER_URL"] = f"sqlite:///{tmp_path / 'broker.db'}"
        elif kind == "sqlite-stale":  # another emulator's visibility behaviour (test-only)
            path = tmp_path / "broker.db"
            self.vars["SHARDQ_BROKER_URL"] = f"sqlite:///{path}?test_stale_visibility=1"
        elif kind == "sqlite-reopen":  # a FIFO defect some emulators have (test-only)
            path = tmp_path / "broker.db"
            self.vars["SHARDQ_BROKER_URL"] = f"sqlite:///{path}?test_reopen_groups=1"
        else:
            server = request.getfixturevalue("sqs_emulator")
            self.vars.update(
                SHARDQ_BROKER_URL="sqs://",
                SHARDQ_ENDPOINT_URL=server.endpoint_url,
                SHARDQ_REGION="us-east-1",
            )
        self.children: list[subprocess.Popen[bytes]] = []

    def config(self) -> Config:
        return Config.load(env={k: v for k, v in self.vars.items() if k.startswith("SHARDQ_")})

    def node(self, *args: str, skew: float = 0.0) -> subprocess.Popen[bytes]:
        """``shardq run`` with ``args`` (``skew``: its wall clock that many seconds off,
        see :mod:`tests.skewed`)."""
        env = {**os.environ, **self.vars}
        main = ["-m", "tests.skewed", str(skew)] if skew else ["-m", "shardq"]
        child = subprocess.Popen(
            [sys.executable, *main, "run", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.children.append(child)
        return child

    def wait_until_catching(self, child: subprocess.Popen[bytes], signum: int) -> None:
        """Wait until ``child`` has a handler for ``signum`` (see :func:`wait_catching`)."""
        wait_catching(child, signum)

    def events(self) -> list[tuple[str, str, int]]:
        """The ledger's complete lines: a node may be writing the last one just now."""
        try:
            text = Path(self.ledger).read_text()
        except FileNotFoundError:
            return []
        complete = text[: text.rfind("\n") + 1].splitlines()
        return [
            (e["event"], e["entity"], e["n"])
            for e in (json.loads(line) for line in complete if line.strip())
        ]

    def wait_for(self, predicate: object, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out; ledger: {self.events()}")

    def stop_all(self) -> None:
        """Kill every child (with its own children, if it leads a process group)."""
        for child in self.children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # the group it leads, if any
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``shardq ARGS`` in a child process with this environment."""
        return subprocess.run(
            [sys.executable, "-m", "shardq", *args],
            cwd=ROOT,
            env={**os.environ, **self.vars},
            capture_output=True,
            text=True,
            timeout=120,
            input=stdin,
        )
