"""An app's copy of its layout document, kept fresh, and the changes written to it.

The document is the only message of group ``layout`` in the app's layout queue
(``{queue_prefix}shardq-layout.fifo``), read and written like the fleet document
(:class:`~shardq.fleet_store.DocStore`). Until the first reshard the queue does not
exist and every worker is at its code's layout; publishers then spend one request
per :data:`~shardq.layout.PUBLISHER_REFRESH_SECONDS` finding that out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import structlog

from shardq import layout as rules
from shardq.errors import LayoutError, QueueNotFoundError, ShardqError
from shardq.fleet_store import DocStore
from shardq.layout import LayoutDoc, WorkerLayout
from shardq.limits import FIFO_SUFFIX

if TYPE_CHECKING:
    from shardq.app import App

log = structlog.get_logger("shardq.layout")

GROUP = "layout"


def layout_queue(queue_prefix: str) -> str:
    """The layout state queue of an app with this queue prefix."""
    return f"{queue_prefix}shardq-layout{FIFO_SUFFIX}"


class Layouts:
    """One app's view of its live layout. Thread-safe; no I/O until first used."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._doc: LayoutDoc | None = None
        self._read_at = float("-inf")  # monotonic time of the last successful read
        self._store: DocStore[LayoutDoc] | None = None
        self._store_key: tuple[int, str] | None = None
        self._ensured = False  # the layout queue was created (or found) by this copy

    # -- reading ---------------------------------------------------------------------
    def get(self, worker: str, *, max_age: float | None = None) -> WorkerLayout:
        """``worker``'s layout, from a copy at most ``max_age`` seconds old (default:
        the config's ``layout_refresh_seconds``)."""
        if max_age is None:
            max_age = self._app.config.layout_refresh_seconds
        if time.monotonic() - self._read_at > max_age:
            self.refresh()
        code = self._app.settings(worker).shards
        return rules.current(self._doc, worker, code)

    def cached(self, worker: str) -> WorkerLayout:
        """``worker``'s layout from the copy in hand (no request)."""
        return rules.current(self._doc, worker, self._app.settings(worker).shards)

    @property
    def doc(self) -> LayoutDoc | None:
        return self._doc

    def age(self) -> float:
        """Seconds since the copy in hand was read (infinite before the first read)."""
        return time.monotonic() - self._read_at

    def refresh(self) -> LayoutDoc | None:
        """Read the document now (one request); a broker error keeps the old copy and
        is raised only if there was none."""
        with self._lock:
            try:
                doc = self.store().read(timeout=5.0)
            except QueueNotFoundError:
                doc = None  # never resharded
            except ShardqError as exc:
                if self._doc is None and self._read_at == float("-inf"):
                    raise
                log.warning("layout.read_failed", error=str(exc))
                return self._doc
            self._doc, self._read_at = doc, time.monotonic()
        return doc

    def moving(self) -> bool:
        """Whether the copy in hand shows a reshard in progress or a retired generation
        with queues left."""
        doc = self._doc
        return doc is not None and any(
            w.moving is not None or w.retired for w in doc.workers.values()
        )

    # -- writing ---------------------------------------------------------------------
    def update(self, worker: str, change: Callable[[WorkerLayout], WorkerLayout]) -> WorkerLayout:
        """Apply ``change`` to ``worker``'s layout under the document's lock."""
        self._app.worker(worker)  # an unknown worker is refused before any request
        code = self._app.settings(worker).shards
        store = self.store()
        if not self._ensured:
            store.ensure()  # once: later writes find the queue
            self._ensured = True

        def apply(doc: LayoutDoc) -> LayoutDoc:
            before = rules.current(doc, worker, code)
            return replace(doc, workers={**doc.workers, worker: change(before)})

        doc = store.update(apply)
        with self._lock:
            self._doc, self._read_at = doc, time.monotonic()
        return doc.workers[worker]

    def store(self) -> DocStore[LayoutDoc]:
        broker, prefix = self._app.broker, self._app.config.queue_prefix
        key = (id(broker), prefix)
        if self._store is None or self._store_key != key:
            self._store = DocStore(
                broker,
                layout_queue(prefix),
                load=LayoutDoc.from_text,
                blank=LayoutDoc,
                group=GROUP,
                what="layout document",
                error=LayoutError,
            )
            self._store_key = key
            self._doc, self._read_at, self._ensured = None, float("-inf"), False
        return self._store

    def forget(self) -> None:
        """Drop the copy in hand (the app's config or broker changed)."""
        with self._lock:
            self._doc, self._read_at, self._store = None, float("-inf"), None
            self._ensured = False
