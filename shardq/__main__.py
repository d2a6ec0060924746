"""``shardq ...`` and ``python -m shardq ...``: the stop handler first, then the rest."""

import sys

from shardq.ops.early import EarlyStop


def entry() -> int:
    """Install ``shardq run``'s early stop handler, then import and run the CLI."""
    argv = sys.argv[1:]
    early = EarlyStop() if argv[:1] == ["run"] else None
    from shardq.ops.cli import main  # the heavy imports come after the handler

    return main(argv, early=early)


if __name__ == "__main__":
    sys.exit(entry())
