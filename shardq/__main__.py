"""``shardq ...`` and ``python -m shardq ...``: the stop handler first, then the rest."""

import sys
import threading

from shardq.core.signals import StopSignals


def entry() -> int:
    """Install ``shardq run``'s early stop handler, then import and run the CLI."""
    argv = sys.argv[1:]
    early = StopSignals(threading.Event()) if argv[:1] == ["run"] else None
    if early is not None:
        early.install()
    from shardq.ops.cli import main  # the heavy imports come after the handler

    return main(argv, early=early)


if __name__ == "__main__":
    sys.exit(entry())
