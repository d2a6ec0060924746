import sys

from shardq.early import entry

sys.exit(entry())
