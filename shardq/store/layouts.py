"""An app's copies of its ``layout/<Worker>`` items, with when (on this process's
monotonic clock) each was read and each state first observed."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from shardq.core.clock import Clock, monotonic
from shardq.core.config import Config
from shardq.core.errors import LayoutError, ShardqError
from shardq.core.jobs import WorkerSettings
from shardq.core.layout import WorkerLayout, may_switch, repair, switch
from shardq.store.base import FIX, DamagedItem, Item, Store, StoreConflict


class Registry(Protocol):
    @property
    def config(self) -> Config: ...
    @property
    def store(self) -> Store: ...
    @property
    def workers(self) -> Mapping[str, object]: ...

    def settings(self, worker: str) -> WorkerSettings: ...


log = structlog.get_logger("shardq.layout")

PREFIX = "layout/"


class Layouts:
    """Thread-safe; no I/O until first used."""

    def __init__(self, app: Registry, clock: Clock = monotonic) -> None:
        self._app = app
        self.clock = clock
        self._lock = threading.Lock()
        # layout, version, when the read that returned it was asked (its trust counts from then)
        self._copies: dict[str, tuple[WorkerLayout, int, float]] = {}
        self._seen: dict[tuple[str, int, str], float] = {}  # (worker, gen, state) -> first seen

    def get(self, worker: str) -> WorkerLayout:
        """From a copy at most ``layout_refresh_seconds`` old, else read; if that fails, a
        copy younger than its ``trust``, else :class:`LayoutError`."""
        copy = self._copies.get(worker)
        if copy is not None and self.clock() - copy[2] <= self._app.config.layout_refresh_seconds:
            return copy[0]
        try:
            return self.read(worker)
        except LayoutError:
            raise
        except ShardqError as exc:
            copy = self._copies.get(worker)
            if copy is None:
                raise  # no copy to fall back on: the store's own error says what to do
            age = self.clock() - copy[2]
            if age > copy[0].trust:
                raise LayoutError(
                    f"cannot read the layout of {worker} from the state store ({exc}); the "
                    f"copy in hand was read {age:.0f} s ago, longer than its trust window "
                    f"({copy[0].trust:.0f} s), so it may be stale and no job of it is "
                    "published by it. Check the store (its table or file, credentials, "
                    "network) and try again"
                ) from exc
            log.warning("layout.read_failed", worker=worker, error=str(exc))
            return copy[0]

    def read(self, worker: str, check: bool = True) -> WorkerLayout:
        """Read ``worker``'s item now, recording the code's ``shards`` if absent; ``check``:
        refuse a class whose ``shards`` changed (not for ``shardq reshard``, its remedy)."""
        asked = self.clock()
        try:
            item = self._app.store.get(PREFIX + worker)
        except DamagedItem as exc:
            raise DamagedItem(str(exc).replace(FIX, repair(worker))) from None
        layout = self._load(worker, item, asked)
        if check:
            self.check(worker, layout)
        return layout

    def check(self, worker: str, layout: WorkerLayout) -> None:
        """Refuse a class whose ``shards`` disagrees with a never-resharded layout."""
        code = self._app.settings(worker).shards
        if layout.gen == 0 and layout.moving is None and layout.shards != code:
            raise LayoutError(
                f"{worker} has shards = {code} in this code, but its queues were recorded "
                f"with {layout.shards} shards (by the first publisher or node of this "
                f"queue_prefix); changing shards in code strands the jobs in the other "
                f"shards. Run `shardq reshard {worker} --shards {code}` to move to {code} "
                f"while keeping each entity's order, or set shards = {layout.shards} again "
                "(or give this app another queue_prefix)"
            )

    def refresh(self) -> dict[str, WorkerLayout]:
        """Read every layout of the app's workers now (one query), as :meth:`read`."""
        asked, store = self.clock(), self._app.store
        items = {i.key[len(PREFIX) :]: i for i in store.query_all(PREFIX, keep_damaged=True)}
        found = {w: self._load(w, items.get(w), asked) for w in self._app.workers}
        for worker, layout in found.items():  # every copy is kept before one is refused
            self.check(worker, layout)
        return found

    def cached(self, worker: str) -> WorkerLayout:
        """The copy in hand (no request); the code's shards before the first read."""
        copy = self._copies.get(worker)
        return copy[0] if copy is not None else WorkerLayout(0, self._app.settings(worker).shards)

    def seen(self, worker: str, gen: int, state: str) -> float | None:
        return self._seen.get((worker, gen, state))

    def moving(self) -> bool:
        """Whether a copy in hand shows a reshard in progress or retired queues left."""
        return any(c[0].moving is not None or c[0].retired for c in self._copies.values())

    def update(self, worker: str, change: Callable[[WorkerLayout], WorkerLayout]) -> WorkerLayout:
        """Apply ``change`` by a conditional put on the version read (again on a conflict)."""
        self.read(worker, check=False)
        store, key = self._app.store, PREFIX + worker
        for _ in range(20):
            layout, version, _ = self._copies[worker]
            after = change(layout)
            if after == layout:
                return layout
            try:
                asked = self.clock()
                item = store.put(key, after.to_value(), version=version)
            except StoreConflict:
                self.read(worker, check=False)
                continue
            return self._keep(worker, item, asked)
        raise LayoutError(f"the layout of {worker} kept changing while it was written; try again")

    def switch_if_due(self, worker: str) -> WorkerLayout:
        """Write the switch once the trust window passed since this process saw the announce."""
        layout = self.cached(worker)
        seen = self.seen(worker, layout.gen, "announced")
        if seen is None or not may_switch(layout, seen, self.clock()):
            return layout
        layout = self.update(worker, lambda w: switch(w, layout.gen))
        log.info("layout.switched", worker=worker, gen=layout.gen, detail="publishers send to it")
        return layout

    def _load(self, worker: str, item: Item | None, asked: float) -> WorkerLayout:
        """Keep ``item`` as read; if absent, record the code's ``shards``."""
        store, key = self._app.store, PREFIX + worker
        code, trust = self._app.settings(worker).shards, self._app.config.reshard_trust_seconds
        while item is None:
            try:
                item = store.put(key, WorkerLayout(0, code, trust).to_value(), version=None)
            except StoreConflict:  # another process recorded it first: read theirs
                item = store.get(key)
        return self._keep(worker, item, asked)

    def _keep(self, worker: str, item: Item, asked: float) -> WorkerLayout:
        """Keep ``item`` as the copy read when ``asked``; its states are seen from now."""
        if item.damaged:
            raise DamagedItem(item.damaged.replace(FIX, repair(worker)))
        layout, version = WorkerLayout.from_value(worker, item.value), item.version
        now = self.clock()
        with self._lock:
            copy = self._copies.get(worker)
            if copy is not None and copy[1] > version:
                return copy[0]  # an older read finished after a newer one
            if copy is not None and copy[1] == version:
                asked = max(asked, copy[2])
            self._copies[worker] = (layout, version, asked)
            self._seen.setdefault((worker, layout.gen, layout.state), now)
            for old in layout.retired:
                self._seen.setdefault((worker, old.gen, "retired"), now)
        return layout

    def forget(self) -> None:
        with self._lock:
            self._copies.clear()
            self._seen.clear()
