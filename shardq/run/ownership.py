"""Which shards a node serves, and taking one on or handing one back while it runs
(docs/design/fleet.md)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import structlog

from shardq.core.errors import ConfigError
from shardq.core.plan import ShardRef
from shardq.run.lane import Lane
from shardq.run.shard import Join, Leave, Shard
from shardq.run.threads import Threads

if TYPE_CHECKING:
    from shardq.run.intake import Intake
    from shardq.store.deployment import Deployment

log = structlog.get_logger("shardq.node")


class Ownership:
    """The shards a node serves, by lane. Thread-safe."""

    def __init__(
        self,
        app: Deployment,
        intake: Intake,
        lanes: list[Lane],
        make_shard: Callable[[ShardRef], Shard],
        threads: Threads,
    ) -> None:
        self._app, self._intake, self._make_shard = app, intake, make_shard
        self._threads = threads
        self._lanes = lanes
        self._lock = threading.Lock()
        self._served: dict[str, tuple[Lane, Shard]] = {
            shard.ref.key: (lane, shard) for lane in lanes for shard in lane.shards
        }
        self._drops: set[threading.Event] = set()  # not set yet
        #: Called with each shard given up (in the thread that gives it up).
        self.dropped: list[Callable[[ShardRef], None]] = []
        self._started = False
        self._finished = False

    def refs(self) -> list[ShardRef]:
        with self._lock:
            return [shard.ref for _, shard in self._served.values()]

    def shards(self) -> list[Shard]:
        """The shards served now: a shard dropped and taken again is another one."""
        with self._lock:
            return [shard for _, shard in self._served.values()]

    def start(self) -> None:
        """Start the lanes; from now on shards come and go through their inboxes."""
        with self._lock:
            self._started = True
            for lane in self._lanes:
                if not self._intake.stopping.is_set():
                    lane.start()

    def add(self, ref: ShardRef) -> None:
        """Serve ``ref`` too, on the lane with the fewest shards (a no-op if served)."""
        key = ref.key
        with self._lock:
            if key in self._served:
                return
        shard = self._shard(ref)
        self._app.ensure_queue(shard.queue, ref.worker)  # a BrokerError goes to the caller
        with self._lock:
            if key in self._served:
                return
            load = Counter(lane for lane, _ in self._served.values())
            lane = min(self._lanes, key=lambda lane: load[lane])
            self._served[key] = (lane, shard)
            if self._started:
                lane.inbox.put(Join(shard))
            else:
                lane.set_shards([*lane.shards, shard])
        log.info("node.shard_added", shard=str(ref), lane=lane.index)

    def drop(self, ref: ShardRef) -> threading.Event:
        """Serve ``ref`` no more; the event is set once the broker confirmed all the
        node held of it (docs/design/fleet.md)."""
        done = threading.Event()
        with self._lock:
            entry = self._served.pop(ref.key, None)
            if entry is None:  # not served here
                done.set()
                return done
            lane, shard = entry
            shard.dropped = True
            if not self._started:
                lane.set_shards([s for s in lane.shards if s is not shard])
            if not self._started or self._finished:
                done.set()
            else:
                self._drops.add(done)
                lane.inbox.put(Leave(shard, lambda: self._swept(shard, done)))
        self._intake.forget(shard.queue)
        for call in self.dropped:
            call(ref)
        log.info("node.shard_dropped", shard=str(ref))
        return done

    def finish(self) -> None:
        """The node stopped (its shutdown sweep is over): every drop is done."""
        with self._lock:
            self._finished = True
            drops, self._drops = self._drops, set()
        for done in drops:
            done.set()

    def _swept(self, shard: Shard, done: threading.Event) -> None:
        receipts = self._intake.leases.settling(shard.queue)
        settle = partial(self._settle, shard, receipts, done)
        if not receipts:  # (most handovers: no thread; a fence drops every shard at once)
            settle()
            return
        self._threads.start(f"shardq-drop-{shard.ref}", f"the handover of {shard.ref}", settle)

    def _settle(self, shard: Shard, receipts: set[str], done: threading.Event) -> None:
        intake = self._intake
        while not intake.leases.wait_released(receipts, 0.1):
            if intake.stopping.is_set():
                return  # the shutdown sweep takes over; finish() sets the event
        with self._lock:
            self._drops.discard(done)
        done.set()
        log.info("node.shard_released", shard=str(shard.ref))

    def _shard(self, ref: ShardRef) -> Shard:
        app = self._app
        settings = app.settings(ref.worker)  # an unknown worker: UnknownWorkerError
        count = app.live_shards(ref.worker).get(ref.name, 0)
        if not 0 <= ref.shard < count:
            raise ConfigError(
                f"{ref.name} has {count} shards now; shard {ref.shard} does not exist. "
                "Check the shard number, the worker's shards setting or its live layout "
                "(shardq stats)."
            )
        if ref.priority != settings.priority:
            raise ConfigError(
                f"shard {ref} has priority {ref.priority} but worker {ref.worker} has "
                f"priority {settings.priority}; build shard refs from the app's settings "
                "(App.plan, or shardq.core.plan.all_shards)."
            )
        return self._make_shard(ref)
