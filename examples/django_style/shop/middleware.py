"""Close the worker thread's DB connection after every job.

Django closes a request's connection when the request ends (``close_old_connections``
on the ``request_finished`` signal). A shardq node has no requests: its threads live as
long as the node, so a connection opened by one job would stay open (and may go stale:
server restarts, idle timeouts, a transaction left open) for every later job of that
thread. This middleware gives each job the request lifecycle.
"""

from __future__ import annotations

from collections.abc import Callable

import shardq
from shop.db import close_old_connections


class CloseDbConnections(shardq.Middleware):
    def around_perform(self, call: Callable[[], None], ctx: shardq.PerformContext) -> None:
        close_old_connections()  # Django does this at request_started too
        try:
            call()
        finally:
            close_old_connections()
