"""Run ``shardq`` with this process's wall clock (``time.time``) off by SKEW seconds.

    python -m tests.skewed 120 run --threads 2

Debian's ``faketime`` would skew the whole process, but with libfaketime 0.9.10
Python's ``time.sleep`` and timed waits fail (EINVAL) or hang, so the skew is made
here: every wall-clock read of shardq goes through ``time.time``; the monotonic
clock is left alone, as a machine whose wall clock is wrong has it.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    skew = float(sys.argv[1])
    real = time.time
    time.time = lambda: real() + skew
    from shardq.__main__ import entry

    sys.argv = ["shardq", *sys.argv[2:]]
    sys.exit(entry())


if __name__ == "__main__":
    main()
