"""The examples run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_applies_each_orders_updates_in_order() -> None:
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "order-42 created -> paid -> shipped" in result.stdout
    assert "order-7 created -> paid -> shipped" in result.stdout
