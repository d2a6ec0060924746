"""Helpers shared by the benchmark scripts (not a test module; run the scripts by hand)."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so ``tests.emulator`` and ``shardq`` import from the repo
    sys.path.insert(0, str(ROOT))


def machine() -> str:
    """One line: cores, Python, load averages (others may be using the machine)."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"nproc={os.cpu_count()} python={platform.python_version()} "
        f"({platform.python_implementation()}) load(1/5/15 min)={load}"
    )


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "shardq", "bench", "tests/apps"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + (
            " (uncommitted changes in shardq/, bench/ or tests/apps/)" if dirty else ""
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def with_emulator(endpoint_url: str | None, run: Callable[[str], None]) -> None:
    """Call ``run(endpoint)`` against ``endpoint_url``, or against a ministack started
    here on 127.0.0.1 (test credentials set) and stopped by its pid afterwards."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    from tests import emulator as emu

    server = None
    endpoint = endpoint_url
    if endpoint is None:
        server = emu.start()
        endpoint = server.endpoint_url
        print(f"ministack pid {server.pid} at {endpoint} (log {server.log_path})", flush=True)
    try:
        run(endpoint)
    finally:
        if server is not None:
            emu.stop(server)
            print(f"ministack pid {server.pid} stopped", flush=True)
