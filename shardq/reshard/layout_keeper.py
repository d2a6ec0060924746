"""A node's part in a reshard (:mod:`shardq.core.layout`): read the layouts, write the
switch when due, close the old shards served here once empty, sweep retired queues."""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import TYPE_CHECKING

import structlog

from shardq import morgue
from shardq.broker.base import Message
from shardq.core import layout as rules
from shardq.core.errors import BrokerError, QueueNotFoundError, ShardqError
from shardq.core.limits import MAX_BATCH_ENTRIES
from shardq.core.plan import ShardRef
from shardq.publish.relay import delete_if_empty, holding, relay, unrelayable
from shardq.run.shard import Shard
from shardq.store.base import DamagedItem

if TYPE_CHECKING:
    from shardq.run.node import Node

log = structlog.get_logger("shardq.layout")

#: A transition of one shard (:func:`shardq.core.layout.close` or `deleted`).
Step = Callable[[rules.WorkerLayout, int, int], rules.WorkerLayout]
#: Visibility of jobs received by the retired-queue sweep while it relays them.
SWEEP_VISIBILITY_SECONDS = 30
#: Each retired queue is looked at this often.
SWEEP_EVERY_SECONDS = 10.0
#: An old shard found empty: the shard, its queue and :meth:`LayoutKeeper._empty`'s answer.
Looked = tuple[Shard, str, int | None]


class LayoutKeeper:
    """Started by the node after its lanes."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.app = node.app
        #: Old shards found empty here: whatever still comes out of them is relayed.
        self.relaying: set[str] = set()
        self._swept: dict[str, float] = {}  # retired queue -> next look (clock)
        # old shard found empty at the last look -> jobs brought, receives in flight then
        self._found: dict[str, tuple[int, set[int]]] = {}
        self._looked: dict[str, tuple[int, set[int]]] = {}  # the same, at the look before
        self._unrelayed: dict[str, float] = {}  # retired queue -> until its sweep's jobs hide
        self._held: set[str] | None = None  # queues of the jobs held here: copied when needed
        self._next_read = 0.0
        self._versions: dict[str, rules.WorkerLayout] = {}  # what the static plan follows
        self._since: dict[Shard, float] = {}  # shard served here -> first seen served
        self._served(self.app.layouts.clock())
        # a shard given up is no longer relaying here: taken back, it waits and looks anew
        node.ownership.dropped.append(lambda ref: self.relaying.discard(ref.key))

    def start(self) -> None:
        # the node's plan was made over the layouts in hand: follow their changes only
        self._versions = {w: self.app.layouts.cached(w) for w in self.app.workers}
        self.node.threads.start("shardq-layout", "the layout keeper", self._loop)

    def route(self, ref: ShardRef, entity: str) -> str:
        if self.relaying and ref.key in self.relaying:  # (ref.key builds a string)
            return rules.RELAY
        return rules.route(self.app.layouts.cached(ref.worker), ref.gen, ref.shard, entity)

    def _loop(self) -> None:
        while not self.node.stopping.wait(0.5):
            self.tick()

    def tick(self) -> None:
        layouts = self.app.layouts
        now = layouts.clock()  # the clock the layouts' observations are stamped with
        self._served(now)
        if now < self._next_read:  # the old shards too are looked at this often
            return
        try:
            layouts.refresh()
        except ShardqError as exc:
            log.warning("layout.read_failed", error=str(exc))
            return
        finally:  # as read: the read that first sees a reshard is followed 2 s later
            busy = layouts.moving()
            every = rules.NODE_REFRESH_SECONDS if busy else self.app.config.layout_refresh_seconds
            self._next_read = now + every
        fleet = self.node.fleet
        if fleet is None or not fleet.elastic:
            self._sync_plan()
        if not layouts.moving():
            self._swept.clear()  # (of queues another node deleted)
            self._unrelayed.clear()
            return
        self._looked, self._found = self._found, {}  # one not looked at now starts over
        self._held, looked = None, []
        for worker in self.app.workers:
            try:
                layout = layouts.switch_if_due(worker)
            except ShardqError as exc:
                log.warning("layout.switch_failed", worker=worker, error=str(exc))
                layout = layouts.cached(worker)
            if layout.moving is not None:
                looked += self._close_old(worker, layout, now)
            if layout.retired:
                self._sweep(worker, layout, now)
        self._held = None  # again after the receives: one of this node's may have taken
        for shard, queue, brought in looked:  # a shard's last jobs
            if self._closable(queue, brought):
                self.relaying.add(shard.ref.key)  # then: given up meanwhile? (a drop takes
                if shard not in self.node.ownership.shards():  # it out, then unmarks it)
                    self.relaying.discard(shard.ref.key)
                    continue
                log.info(
                    "layout.closing", shard=str(shard.ref), detail="found empty; relays from now on"
                )

    def _served(self, now: float) -> None:
        self._since = {s: self._since.get(s, now) for s in self.node.ownership.shards()}

    def _sync_plan(self) -> None:
        layouts = {w: self.app.layouts.cached(w) for w in self.app.workers}
        if layouts == self._versions:
            return
        plan = self.node.plan
        try:
            wanted = set(self.app.plan(node=plan.node, nodes=plan.nodes).shards)
        except ShardqError:
            return
        served = set(self.node.shard_refs())
        for ref in sorted(served - wanted, key=str):
            self.node.drop_shard(ref)
        for ref in sorted(wanted - served, key=str):
            try:
                self.node.add_shard(ref)
            except ShardqError as exc:
                log.warning("layout.add_failed", shard=str(ref), error=str(exc))
                return  # tried again at the next tick
        self._versions = layouts

    def _close_old(self, worker: str, layout: rules.WorkerLayout, now: float) -> list[Looked]:
        """Record the old shards relaying here that are done; returns those to close if
        :meth:`_closable` after the receives of the look."""
        move = layout.moving
        assert move is not None
        self._held = None  # (another worker's look may have taken seconds: copied again)
        seen = self.app.layouts.seen(worker, layout.gen, "switched")
        if seen is None:
            return []
        done: list[int] = []
        looked: list[Looked] = []
        # jobs a previous owner (or process) of a shard took stay hidden up to their
        # visibility timeout, unseen by a receive: a shard served that long here may close
        settled = now - self.app.settings(worker).visibility_timeout - rules.SWITCH_MARGIN_SECONDS
        for shard in self.node.ownership.shards():
            ref = shard.ref
            if ref.worker != worker or not rules.may_close(layout, ref.gen, ref.shard, seen, now):
                continue
            queue = shard.queue
            if ref.key in self.relaying:
                if queue not in self._held_queues():  # nothing of it runs here any more: record it
                    done.append(ref.shard)
            elif self._since.get(shard, now) > settled or self._holds(queue):
                continue
            elif (brought := self._empty(queue)) is not None:
                looked.append((shard, queue, None if queue in self._looked else brought))
        if done:
            self._record(worker, "closed", rules.close, [(move.gen, shard) for shard in done])
        return looked

    def _empty(self, queue: str) -> int | None:
        """A receive finds ``queue`` empty: how many jobs this node's receives of it had
        brought before (:meth:`Intake.receives`); None if it is not found empty."""
        brought = self.node.intake.receives(queue)[0]
        try:
            found = holding(self.app.broker, queue)
        except BrokerError as exc:
            self.node.broker_trouble("counts", queue, exc)
            return None
        return None if found else brought

    def _closable(self, queue: str, brought: int | None) -> bool:
        """Found empty now (``brought``: :meth:`_empty`; None: at the last look too) with
        no job held (their queues copied after the receive) or hidden here; and the
        receives of this node's in flight at the first such look (one may have taken jobs
        that look missed) have ended since, bringing nothing."""
        receives = self.node.intake.receives
        if self._holds(queue):
            return False
        found = self._looked[queue] if brought is None else (brought, receives(queue)[1])
        brought, in_flight = receives(queue)
        if brought == found[0] and found[1] & in_flight:
            self._found[queue] = found  # looked at again once they ended
        return brought == found[0] and not found[1] & in_flight

    def _held_queues(self) -> set[str]:
        """The queues of the jobs held here, copied (under the leases' lock, which the
        lanes take on their hot path) at most once a look, and again after its receives."""
        if self._held is None:
            self._held = {m.queue for m in self.node.leases.held()}
        return self._held

    def _holds(self, queue: str) -> bool:
        """A job of ``queue`` is held here (:meth:`_held_queues`), hidden for a retry,
        or may be hidden by a receive of the node that failed (:meth:`Intake.unsure`)."""
        leases, intake = self.node.leases, self.node.intake
        return queue in self._held_queues() or leases.hidden(queue)[1] > 0 or intake.unsure(queue)

    def _sweep(self, worker: str, layout: rules.WorkerLayout, now: float) -> None:
        mine = {
            r.shard for r in self.node.shard_refs() if r.worker == worker and r.gen == layout.gen
        }
        gone: list[tuple[int, int]] = []
        for old in layout.retired:
            seen = self.app.layouts.seen(worker, old.gen, "retired")
            for shard in old.left:
                queue = self.app.shard_queue(worker, shard, old.gen)
                if shard % layout.shards not in mine or self._swept.get(queue, 0.0) > now:
                    continue
                self._swept[queue] = now + SWEEP_EVERY_SECONDS
                ripe = seen is not None and rules.may_delete(seen, now, layout.trust)
                if self._sweep_one(worker, queue, ripe):
                    gone.append((old.gen, shard))
                    del self._swept[queue]  # (swept again if its deletion is not recorded)
                    self._unrelayed.pop(queue, None)
        if gone:
            self._record(worker, "queues_deleted", rules.deleted, gone)

    def _sweep_one(self, worker: str, queue: str, ripe: bool) -> bool:
        """Relay what reached retired ``queue``; delete it if ``ripe`` and empty."""
        broker, clock = self.app.broker, self.app.layouts.clock
        try:
            try:
                messages = broker.receive(
                    queue, max_messages=MAX_BATCH_ENTRIES, wait_seconds=0,
                    visibility_timeout=SWEEP_VISIBILITY_SECONDS,
                )  # fmt: skip
            except BrokerError:  # it may have taken jobs, its answer lost: hidden 30 s
                self._unrelayed[queue] = clock() + SWEEP_VISIBILITY_SECONDS
                raise
            if messages:  # hidden until relayed (timed from now: the receive has returned)
                self._unrelayed[queue] = clock() + SWEEP_VISIBILITY_SECONDS
                refused = relay(self.app, worker, messages)
                done = [m for m in messages if self._buried(worker, m, refused)]
                broker.delete_batch(queue, [m.receipt for m in done])
                if len(done) == len(messages):  # else those left stay hidden a while
                    del self._unrelayed[queue]
                self._swept[queue] = 0.0  # more may wait
                return False
            hidden = self.node.leases.hidden(queue)[1] or self._unrelayed.get(queue, 0) > clock()
            return ripe and not hidden and not delete_if_empty(broker, queue)
        except QueueNotFoundError:
            return True  # deleted already: record it
        except BrokerError as exc:
            self.node.broker_trouble("sweep", queue, exc)
            return False

    def _buried(self, worker: str, message: Message, refused: dict[str, str]) -> bool:
        """Is ``message`` relayed, or refused for good by the relay and in the morgue?"""
        if message.message_id not in refused:
            return True
        error = unrelayable(refused[message.message_id])
        record = morgue.record_for(message, morgue.REASON_INVALID, error, message.receive_count)
        try:
            morgue.bury(self.app.store, worker, [record])
        except (morgue.StoreError, DamagedItem) as exc:  # it is relayed again, then buried
            log.error("job.morgue_failed", worker=worker, entity=message.group_id, error=str(exc))
            return False
        log.warning("layout.relay_refused", worker=worker, entity=message.group_id,
                    message_id=message.message_id, error=str(error))  # fmt: skip
        return True

    def _record(self, worker: str, what: str, step: Step, shards: list[tuple[int, int]]) -> None:
        try:
            after = self.app.layouts.update(
                worker, lambda w: reduce(lambda x, s: step(x, *s), shards, w)
            )
        except ShardqError as exc:
            log.warning(f"layout.{what}_failed", worker=worker, error=str(exc))
            return
        log.info(f"layout.{what}", worker=worker, shards=shards)
        if what == "closed" and after.moving is None:
            log.info("layout.reshard_done", worker=worker, shards=after.shards, gen=after.gen)
