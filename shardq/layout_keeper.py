"""A node's part in a reshard (see :mod:`shardq.layout` for the whole procedure).

One thread per node, ``shardq-layout``:

* keeps the app's copy of the layout document fresh: every
  :data:`~shardq.layout.NODE_REFRESH_SECONDS` while a reshard is under way; else when
  the fleet says a reshard began (a notice on the leases queue, or the fleet
  document's layout mark) and every :data:`IDLE_REFRESH_SECONDS`. A node without
  fleet membership (built in code without ``membership``; ``shardq run`` always has
  one) reads it only when it starts, so an idle node costs no request for it;
* a static node serves the shards its plan gives it in the live layout (an elastic
  node's fleet takes and hands back leases of new and old shards on its own);
* **closes** the old shards this node serves once allowed and seen empty: it first
  makes them relay here (nothing of them runs here any more), waits until it holds
  none of their jobs, then records them closed in the document;
* **sweeps** retired queues (its share of them, by node rank): relays what a late
  publisher still sent there, and deletes each queue once empty after the grace.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from shardq import layout as rules
from shardq.broker.base import Message
from shardq.errors import BrokerError, QueueNotFoundError, ShardqError
from shardq.limits import MAX_BATCH_ENTRIES
from shardq.plan import ShardRef
from shardq.relay import relay

if TYPE_CHECKING:
    from shardq.node import Node

log = structlog.get_logger("shardq.layout")

#: Visibility of jobs received by the retired-queue sweep while it relays them.
SWEEP_VISIBILITY_SECONDS = 30
#: Each retired queue is looked at this often (for late jobs to relay, and to delete it).
SWEEP_EVERY_SECONDS = 10.0
#: A node in a fleet reads the layout this often when no reshard is under way (the
#: fleet document's layout mark tells it sooner when one begins).
IDLE_REFRESH_SECONDS = 300.0


@dataclass
class _Closing:
    first_empty: float  # monotonic time of the first of the looks that agree
    left: frozenset[str]  # entities with jobs left in it (empty: none)


class LayoutKeeper:
    """See the module doc. Started by the node after its lanes; a daemon thread."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.app = node.app
        self.failed = False
        #: Shard keys of old shards that relay here (closed, or about to be).
        self.relaying: set[str] = set()
        #: Old shards narrowed here: only these entities' jobs still run in them.
        self.narrowed: dict[str, frozenset[str]] = {}
        self._recorded: dict[str, frozenset[str]] = {}  # narrowings in the document
        self._closing: dict[str, _Closing] = {}
        self._swept: dict[str, float] = {}  # retired queue -> monotonic time of its next look
        self._next_refresh = 0.0
        self._mark: int | None = None  # the fleet document's layout mark last acted on
        self._poked = False
        self._version = 0  # the layout document's version the static plan follows
        self._thread = threading.Thread(target=self._guard, name="shardq-layout", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return not self.failed and (self._thread.is_alive() or self.node.stopping.is_set())

    def poke(self) -> None:
        """Read the layout at the next tick (a reshard notice arrived)."""
        self._poked = True
        self._next_refresh = 0.0

    def route(self, ref: ShardRef, entity: str) -> str:
        """The executor's router: the document's decision, or relay for a shard this
        node is closing."""
        if self.app.layouts.doc is None and ref.gen == 0:
            return rules.RUN  # never resharded: nothing to look up (every job asks)
        if ref.key in self.relaying:
            return rules.RELAY
        narrowed = self.narrowed.get(ref.key)
        if narrowed is not None and entity not in narrowed:
            return rules.RELAY
        return rules.route(self.app.layouts.cached(ref.worker), ref.gen, ref.shard, entity)

    # -- the loop -------------------------------------------------------------------
    def _guard(self) -> None:
        try:
            while not self.node.stopping.wait(0.5):
                self.tick()
        except BaseException as exc:
            self.failed = True
            self.node.fail("the layout keeper", exc)

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next_refresh:
            return
        layouts, fleet = self.app.layouts, self.node.fleet
        every = self.app.config.layout_refresh_seconds
        if layouts.moving():
            every = min(every, rules.NODE_REFRESH_SECONDS)
        elif fleet is None:  # a node outside a fleet reads the layout when it starts, then if poked
            every = math.inf
        poked, self._poked = self._poked, False
        if layouts.age() >= every or poked:  # a fleet node: every layout_refresh_seconds
            try:
                layouts.refresh()
            except ShardqError as exc:
                log.warning("layout.read_failed", error=str(exc))
        doc = layouts.doc
        version = doc.version if doc is not None else 0
        static = fleet is None or not fleet.elastic  # an elastic node's fleet follows it
        if version != self._version and (not static or self._sync_plan()):
            self._version = version
        busy = layouts.moving()
        if busy:
            self._close_old()
            self._sweep_retired()
        self._next_refresh = now + (rules.NODE_REFRESH_SECONDS if busy else 0.5)

    # -- static nodes: the plan over the live layout -----------------------------------
    def _sync_plan(self) -> bool:
        """Serve the shards of this node's plan over the live layout; False if one could
        not be added (tried again at the next tick)."""
        plan = self.node.plan
        try:
            wanted = set(self.app.plan(node=plan.node, nodes=plan.nodes).shards)
        except ShardqError:
            return False
        served = set(self.node.shard_refs())
        for ref in sorted(served - wanted, key=str):
            self.node.drop_shard(ref)
        ok = True
        for ref in sorted(wanted - served, key=str):
            try:
                self.node.add_shard(ref)
            except ShardqError as exc:
                log.warning("layout.add_failed", shard=str(ref), error=str(exc))
                ok = False
        return ok

    # -- closing the old shards served here ----------------------------------------------
    def _close_old(self) -> None:
        now, wall = time.monotonic(), time.time()
        held = self.node.leases.held()
        done: dict[str, list[int]] = {}
        for ref in self.node.shard_refs():
            layout = self.app.layouts.cached(ref.worker)
            if not rules.may_close(layout, ref.gen, ref.shard, wall):
                self._closing.pop(ref.key, None)
                if layout.moving is None or ref.gen != layout.moving.gen:
                    self.relaying.discard(ref.key)
                    self.narrowed.pop(ref.key, None)
                continue
            queue = self.app.shard_queue(ref.worker, ref.shard, ref.gen)
            mine = {m.group_id for m in held if m.queue == queue}
            if ref.key in self.relaying:  # confirmed empty: close once nothing is held
                if not mine:
                    done.setdefault(ref.worker, []).append(ref.shard)
                continue
            left = self._left(ref, queue, held)
            if left is None:
                self._closing.pop(ref.key, None)
                continue
            before = self._closing.get(ref.key)
            same = before is not None and (left == before.left if not left else left <= before.left)
            if not same or before is None:
                self._closing[ref.key] = _Closing(now, left)
                continue
            if now - before.first_empty < rules.CLOSE_CONFIRM_SECONDS:
                continue
            if not left:
                self.relaying.add(ref.key)  # from now on nothing of it runs here
                self._closing.pop(ref.key, None)
                log.info("layout.closing", shard=str(ref))
            elif self.narrowed.get(ref.key) != left:
                self.narrowed[ref.key] = left  # other entities' late jobs relay from now on
                self._recorded.pop(ref.key, None)
            narrowed = self.narrowed.get(ref.key)
            if narrowed and mine <= narrowed and self._recorded.get(ref.key) != narrowed:
                self._record_narrowed(ref, narrowed)
        for worker, shards in done.items():
            self._record_closed(worker, shards)

    def _left(self, ref: ShardRef, queue: str, held: list[Message]) -> frozenset[str] | None:
        """The entities that still have jobs in old shard ``queue``: none (an empty set)
        if it is empty; else, if every job in flight in it is one this node holds or
        hid for a retry and nothing in it can be received (what waits is blocked behind
        those jobs, FIFO order keeps it so), those jobs' entities; None if that cannot
        be told now."""
        shard = self.node.ownership.shard(ref)
        if shard is None or not shard.watched or shard.batches or shard.fetching:
            return None  # the lane is still taking jobs from it: no need to ask
        mine = [m for m in held if m.queue == queue]
        hidden, hidden_now = self.node.leases.hidden(queue)
        broker = self.app.broker
        try:
            counts = broker.counts(queue)
            if counts.waiting == 0 and counts.in_flight == 0 and not mine:
                return frozenset()
            if counts.in_flight != len(mine) + hidden_now:
                return None  # jobs in flight elsewhere (another node's, or lapsed)
            peek = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=0)
        except QueueNotFoundError:
            return frozenset()
        except BrokerError as exc:
            self.node.broker_trouble("counts", queue, exc)
            return None
        if peek:
            return None  # jobs that can still be received: the lane takes them first
        return frozenset({m.group_id for m in mine} | set(hidden))

    def _record_narrowed(self, ref: ShardRef, entities: frozenset[str]) -> None:
        try:
            self.app.layouts.update(
                ref.worker, lambda layout: rules.narrow(layout, ref.shard, entities)
            )
        except ShardqError as exc:
            log.warning("layout.narrow_failed", shard=str(ref), error=str(exc))
            return
        self._recorded[ref.key] = entities
        log.info(
            "layout.narrowed",
            shard=str(ref),
            entities=len(entities),
            detail="closed to every entity but those still with jobs in it: the others' "
            "new jobs run",
        )

    def _record_closed(self, worker: str, shards: list[int]) -> None:
        def change(layout: rules.WorkerLayout) -> rules.WorkerLayout:
            for shard in shards:
                if layout.moving is not None:
                    layout = rules.close(layout, shard, time.time())
            return layout

        try:
            after = self.app.layouts.update(worker, change)
        except ShardqError as exc:
            log.warning("layout.close_failed", worker=worker, error=str(exc))
            return
        log.info(
            "layout.closed",
            worker=worker,
            shards=shards,
            left=len(after.moving.left) if after.moving else 0,
            detail="these old shards relay from now on; their entities run in the new layout",
        )
        if after.moving is None:
            log.info("layout.reshard_done", worker=worker, shards=after.shards, gen=after.gen)

    def _empty(self, queue: str) -> bool:
        try:
            counts = self.app.broker.counts(queue)
        except QueueNotFoundError:
            return True
        except BrokerError as exc:
            self.node.broker_trouble("counts", queue, exc)
            return False
        return counts.waiting == 0 and counts.in_flight == 0

    # -- retired queues ---------------------------------------------------------------
    def _sweep_retired(self) -> None:
        doc = self.app.layouts.doc
        if doc is None:
            return
        rank, among = self._rank()
        now = time.monotonic()
        for worker, layout in doc.workers.items():
            if worker not in self.app.workers:
                continue
            gone: list[tuple[int, int]] = []
            for old in layout.retired:
                for shard in old.left:
                    queue = self.app.shard_queue(worker, shard, old.gen)
                    if shard % among != rank or self._swept.get(queue, 0.0) > now:
                        continue
                    self._swept[queue] = now + SWEEP_EVERY_SECONDS
                    if self._sweep(worker, queue, old.gen, shard):
                        gone.append((old.gen, shard))
            if gone:
                self._record_deleted(worker, gone)

    def _record_deleted(self, worker: str, gone: list[tuple[int, int]]) -> None:
        def change(layout: rules.WorkerLayout) -> rules.WorkerLayout:
            for gen, shard in gone:
                layout = rules.deleted(layout, gen, shard)
            return layout

        try:
            self.app.layouts.update(worker, change)
        except ShardqError as exc:
            log.warning("layout.delete_record_failed", worker=worker, error=str(exc))
            return
        log.info("layout.queues_deleted", worker=worker, queues=len(gone))

    def _sweep(self, worker: str, queue: str, gen: int, shard: int) -> bool:
        """Relay what reached retired ``queue``; delete it once allowed and empty.
        True if it is gone."""
        broker = self.app.broker
        try:
            messages = broker.receive(
                queue,
                max_messages=MAX_BATCH_ENTRIES,
                wait_seconds=0,
                visibility_timeout=SWEEP_VISIBILITY_SECONDS,
            )
            if messages:
                relay(self.app, worker, messages)
                broker.delete_batch(queue, [m.receipt for m in messages])
                self._swept[queue] = 0.0  # more may wait: look again at the next tick
                return False
            layout = self.app.layouts.cached(worker)
            if not rules.may_delete(layout, gen, shard, time.time()) or not self._empty(queue):
                return False
            broker.delete_queue(queue)
        except QueueNotFoundError:
            pass  # deleted already (by another node, or by hand): record it
        except BrokerError as exc:
            self.node.broker_trouble("sweep", queue, exc)
            return False
        log.info("layout.queue_deleted", queue=queue, detail="a retired queue, empty")
        return True

    def _rank(self) -> tuple[int, int]:
        """This node's share of the retired queues: (its rank, among how many)."""
        fleet = self.node.fleet
        if fleet is not None and fleet.elastic:
            live = sorted(fleet.live_nodes() | {fleet.id})
            return live.index(fleet.id), len(live)
        return self.node.plan.node, max(1, self.node.plan.nodes)
