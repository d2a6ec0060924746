"""Child ``shardq`` processes sharing a broker with the test: environment and helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shardq.core.config import Config
from tests.apps import ledger

ROOT = Path(__file__).resolve().parent.parent


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
        """Wait until ``child`` has a handler for ``signum`` (Linux: its SigCgt mask):
        before that, it is still the bare interpreter starting, which any signal kills."""
        status = Path(f"/proc/{child.pid}/status")
        deadline = time.monotonic() + 30
        while status.exists() and time.monotonic() < deadline and child.poll() is None:
            caught = next(
                (line for line in status.read_text().splitlines() if line.startswith("SigCgt:")),
                "SigCgt:\t0",
            )
            if int(caught.split()[1], 16) >> (signum - 1) & 1:
                return
            time.sleep(0.01)
        if status.exists() and child.poll() is None and time.monotonic() >= deadline:
            raise AssertionError(f"process {child.pid} installed no handler for {signum} in 30 s")

    def events(self) -> list[tuple[str, str, int]]:
        if not Path(self.ledger).exists():
            return []
        return [(e["event"], e["entity"], e["n"]) for e in ledger.read(self.ledger)]

    def wait_for(self, predicate: object, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out; ledger: {self.events()}")

    def stop_all(self) -> None:
        for child in self.children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
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
