import sys

from shardq.cli import main

sys.exit(main())
