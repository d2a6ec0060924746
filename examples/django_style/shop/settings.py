"""Settings, as in a Django project's ``settings.py``.

Files go to ``$SHOP_DATA_DIR`` (default: ``shardq-django-style`` in the system temp
directory), never into the source tree.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DATA_DIR = Path(
    os.environ.get("SHOP_DATA_DIR") or Path(tempfile.gettempdir()) / "shardq-django-style"
)

DATABASES = {"default": {"NAME": str(DATA_DIR / "shop.sqlite3")}}

#: Close the thread's DB connection after every job, as Django does after every request
#: with ``CONN_MAX_AGE = 0``. Set ``SHOP_CLOSE_DB_CONNECTIONS=0`` to see the difference.
CLOSE_DB_CONNECTIONS = os.environ.get("SHOP_CLOSE_DB_CONNECTIONS", "1") != "0"

#: shardq settings; ``manage.py shardq_run`` passes them to ``shardq run`` as flags.
SHARDQ = {
    "broker_url": f"sqlite:///{DATA_DIR / 'broker.sqlite3'}",
    "threads": 4,
}
