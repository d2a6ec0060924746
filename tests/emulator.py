"""Start and stop a ministack (SQS and DynamoDB) process on 127.0.0.1 for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class Emulator:
    pid: int
    port: int
    log_path: str

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(port: int | None = None, timeout: float = 30.0, state_dir: str | None = None) -> Emulator:
    """Start ministack bound to 127.0.0.1 and wait until it accepts connections.

    With ``state_dir``, ministack keeps its state there (``PERSIST_STATE=1``): it saves
    queues and messages when stopped with SIGTERM (:func:`stop`) and loads them when
    started again, so a restart on the same port is an outage, not a new SQS. Without
    it (the default), a restarted emulator is empty.
    """
    port = port or free_port()
    fd, log_path = tempfile.mkstemp(prefix=f"ministack-{port}-", suffix=".log")
    env = dict(
        os.environ,
        BIND_HOST="127.0.0.1",
        GATEWAY_PORT=str(port),
        SERVICES="sqs,dynamodb",
        LOG_LEVEL="WARNING",
    )
    if state_dir is not None:
        env.update(PERSIST_STATE="1", STATE_DIR=state_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ministack"],
        env=env,
        stdout=fd,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    os.close(fd)
    emulator = Emulator(proc.pid, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ministack exited with {proc.returncode}; see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return emulator
        except OSError:
            time.sleep(0.05)
    stop(emulator)
    raise RuntimeError(f"ministack did not listen on port {port} within {timeout} s")


def stop(emulator: Emulator, timeout: float = 5.0) -> None:
    """Stop the emulator by its pid: SIGTERM, then SIGKILL if it lingers."""
    try:
        os.kill(emulator.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(emulator.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)
    os.kill(emulator.pid, signal.SIGKILL)
    os.waitpid(emulator.pid, 0)
