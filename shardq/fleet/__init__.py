"""A node's membership of its app's fleet: ``node/<id>`` heartbeats and ``shard/<key>``
owners in the state store, moved by conditional writes (docs/deployment.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from shardq.core.clock import Clock
from shardq.core.errors import ShardqError
from shardq.core.fleet_rules import (
    ELASTIC,
    GONE_KEPT_SECONDS,
    ROUND_SECONDS,
    STATIC,
    Beat,
    Owner,
    decide,
    expired,
    live_nodes,
    observe,
    timing,
    unreadable_owner,
)
from shardq.core.heartbeat import Heartbeat, prefix_of
from shardq.core.plan import ShardRef
from shardq.core.topology import parse_key, parse_name
from shardq.fleet.others import Damaged, Foreign, fit, mark_gone
from shardq.fleet.report import Rate, heartbeat
from shardq.run.threads import side_by_side
from shardq.store import Item, Store, StoreConflict, StoreError
from shardq.store.deployment import live_shards

if TYPE_CHECKING:
    from shardq.run.node import Node

log = structlog.get_logger("shardq.fleet")

NODE_PREFIX, SHARD_PREFIX = "node/", "shard/"
#: A shard this node could not take is left alone this long before trying again.
REFUSED_SECONDS = 30.0
#: Takes, frees and purges a node makes side by side (each a store write, a take also
#: a queue lookup): a departed node's hundreds of shards are taken over in seconds.
PARALLEL = 8


class Fleet:
    """One node's membership; ``clock``: monotonic (default: the node's)."""

    def __init__(
        self,
        node: Node,
        *,
        elastic: bool,
        node_id: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self.app = node.app
        self.store: Store = node.app.store
        self.id = node_id or node.id
        self.elastic = elastic
        self.prefix = node.app.config.queue_prefix  # of the heartbeats of its fleet
        self.clock = clock = node.clock if clock is None else clock
        self.wall = node.wall
        self.beat_seconds, self.expire_seconds = timing(node.app.config.lease_seconds)
        self.started = node.wall()
        self.parallel = PARALLEL
        self._version: int | None = None  # of this node's heartbeat item
        self._beat_ok = clock()  # when the last successful heartbeat write was sent
        self._fences = 0  # how many times it stopped serving every shard
        self._next_beat = 0.0
        self._seen: dict[str, tuple[int, float]] = {}
        self._foreign = Foreign(self.expire_seconds)  # other apps' nodes sharing the store
        self._owned: dict[str, int] = {}  # key -> version of the ownership item
        self._draining: dict[str, tuple[threading.Event, int]] = {}
        self._refused: dict[str, float] = {}  # key -> when this node could not take it
        self._damaged = Damaged()
        self._unreadable: dict[str, tuple[int, float]] = {}  # shard key -> version, seen at
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rate = Rate(clock())

    def join(self) -> None:
        """Write the first heartbeat (a store error stops the node) and start the thread."""
        self._beat(self.clock())
        log.info("fleet.joined", node=self.id, mode=ELASTIC if self.elastic else STATIC)
        self._thread = self.node.threads.start("shardq-fleet", "the fleet membership", self._loop)
        if self.elastic:  # on time even while a store call holds the fleet's thread
            self.node.threads.start("shardq-fence", "the fleet's lease watch", self._watch)

    def leave(self) -> None:
        """After the node's shutdown sweep: delete the heartbeat, free every shard."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        with self._lock:
            owned = {**self._owned, **{k: v for k, (_, v) in self._draining.items()}}
            self._owned, self._draining = {}, {}
        # without its heartbeat the node's shards are free to take at once; then freed
        self._write(self.store.delete, NODE_PREFIX + self.id, version=None)
        side_by_side([partial(self._free, k, v) for k, v in owned.items()], self.parallel)
        log.info("fleet.left", node=self.id, released=len(owned))

    def held(self) -> list[str]:
        with self._lock:
            return sorted({*self._owned, *self._draining})

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(ROUND_SECONDS if self.elastic else self.beat_seconds)

    def _watch(self) -> None:
        while not self._stop.wait(ROUND_SECONDS / 4):
            self._fence_if_late()

    def _fence_if_late(self) -> bool:
        """Stop serving every shard once others may take them soon, until a beat."""
        if self.node.stopping.is_set():
            return False
        late = self.clock() - self._beat_ok > self.expire_seconds - ROUND_SECONDS
        if late and (self._owned or self.node.shard_refs()):  # (said once, not each look)
            log.warning(
                "fleet.fenced",
                node=self.id,
                detail="its heartbeat could not be written for nearly the expiry: it serves "
                "no shard (others may take them) until a beat succeeds",
            )
        if late:
            self._fence()
        return late

    def step(self) -> None:
        now = self.clock()
        self._beat_when_due(now)
        if not self.elastic or self.node.stopping.is_set():
            return  # a stopping node beats on (its shards are not free) until it leaves
        if self._fence_if_late():  # on the clock now: the beat may have taken long
            return
        self._settle_drains()  # before the read: the snapshot shows what it freed
        fences = self._fences  # a fence after this: what the read shows may be stale
        try:
            owned = self.store.query_all(SHARD_PREFIX, keep_damaged=True)
            asked = self.clock()  # a counter read is at least as new as this, at most as
            beats = self.store.query_all(NODE_PREFIX, keep_damaged=True)  # the answer
            answered = self.clock()
        except StoreError as exc:
            log.warning("fleet.read_failed", error=str(exc))
            return
        items: list[Item] = []
        foreign: list[Item] = []
        for i in beats:
            (items if prefix_of(i.value) in (None, self.prefix) else foreign).append(i)
        self._damaged.report([*owned, *items])
        others = {i.key[len(NODE_PREFIX) :]: i for i in foreign}
        alien = self._foreign.live(asked, answered, others)
        self._act(asked, answered, owned, items, alien, fences)

    def _beat_now(self) -> None:
        self._beat_when_due(self.clock())

    def _beat_when_due(self, now: float) -> None:
        if now >= self._next_beat and not self._stop.is_set():  # (none once it left)
            try:
                self._beat(now)
            except StoreError as exc:
                log.warning("fleet.heartbeat_failed", error=str(exc))
                self._next_beat = now + ROUND_SECONDS

    def _beat(self, now: float) -> None:
        key, report = NODE_PREFIX + self.id, fit(self.report().to_value())
        try:
            item = self.store.put(key, report, version=self._version)
        except StoreConflict:
            if self._stop.is_set():
                return  # deleted by leave() meanwhile: never written again
            # a query, not a get: a damaged heartbeat of this node's is read, then rewritten
            current = next(
                (i for i in self.store.query_all(key, keep_damaged=True) if i.key == key), None
            )
            if current is not None and current.damaged and not current.version:
                # no write can name an unreadable version; only this node writes this item
                self.store.delete(key)
                current = None
            if current is not None and current.value.get("gone"):
                log.warning(
                    "fleet.declared_gone",
                    node=self.id,
                    reason=current.value.get("gone"),
                    detail="its heartbeat stood still too long; it gives up its shards",
                )
                self._fence()
            item = self.store.put(key, report, version=None if current is None else current.version)
        self._version = item.version
        self._beat_ok = now
        self._next_beat = now + self.beat_seconds

    def _act(
        self,
        now: float,
        answered: float,
        owned: list[Item],
        items: list[Item],
        foreign: set[str],
        fences: int,
    ) -> None:  # heartbeats read: asked at now, answered at answered
        by_key = {i.key[len(NODE_PREFIX) :]: i for i in items}
        reports = {n: Heartbeat.from_value(n, i.value) for n, i in by_key.items()}
        # an unreadable heartbeat reads as an empty report and expires as a still one does
        beats = {n: Beat(n, by_key[n].version, r.mode, r.gone) for n, r in reports.items()}
        self._seen = observe(self._seen, beats, answered)  # a move stamped late, judged early
        if self.id in beats:  # this node is live to itself while its beats succeed
            self._seen[self.id] = (beats[self.id].counter, answered)
        live = live_nodes(beats, self._seen, now, self.expire_seconds)  # decide adds this node
        dead = expired(beats, self._seen, now, self.expire_seconds)
        # an unreadable heartbeat's node is not live, but its shards are left alone until
        # it beats again or stood still for the lease (marking it gone may be impossible)
        unknown = {n for n, i in by_key.items() if i.damaged} - set(dead)
        live -= unknown
        held = {n: set(r.held) for n, r in reports.items()} | {self.id: set(self.held())}
        owners, left = self._owners(now, owned, held, live)
        left |= {key for key, owner in owners.items() if owner.node in unknown | foreign}
        for node in dead:
            if node != self.id:
                mark_gone(self.store, by_key[node], self.wall(), self.id)
        for node, beat in beats.items():  # marked gone and still for an hour: delete
            if beat.gone and now - self._seen[node][1] >= GONE_KEPT_SECONDS:
                self._write(self.store.delete, NODE_PREFIX + node, version=beat.counter)
        self._refused = {k: t for k, t in self._refused.items() if now - t < REFUSED_SECONDS}
        with self._lock:
            busy = {*self._draining, *self._refused, *left}
        serving = {ref.key for ref in self.node.shard_refs()}
        moves = decide(self.id, live_shards(self.app), live, owners, serving, busy)
        for key in moves.lost:
            log.warning("fleet.shard_lost", shard=key, owner=owners[key].node)
            with self._lock:
                self._owned.pop(key, None)
            self.node.drop_shard(self._ref(key))
        for key, version in moves.free.items():
            done = self.node.drop_shard(self._ref(key))
            with self._lock:
                self._owned.pop(key, None)
                self._draining[key] = (done, version)
        purge = [
            partial(self._write, self.store.delete, SHARD_PREFIX + k, version=v)
            for k, v in moves.purge.items()
        ]
        serve = [partial(self._take, k, owners[k].version, now, fences) for k in moves.serve]
        # a node whose own heartbeat is unreadable takes nothing new until it beats
        claims = {} if self.id in unknown else moves.claim
        claim = [partial(self._claim, k, v, owners.get(k), now, fences) for k, v in claims.items()]
        side_by_side(
            [*purge, *serve, *claim], self.parallel, self._beat_now, until=self.node.stopping
        )

    def _claim(
        self, key: str, claim: int | None, was: Owner | None, now: float, fences: int
    ) -> None:
        if self._fence_if_late() or self._fences != fences:  # it would not serve it
            return
        try:
            item = self.store.put(SHARD_PREFIX + key, {"owner": self.id}, version=claim)
        except StoreError:
            return  # another node took it first (or the store failed): next round
        self._take(key, item.version, now, fences)
        if was is not None and was.node and key in self._owned:  # (not a freed one)
            log.info("fleet.took_over", shard=key, previous=was.node)

    def _owners(
        self, now: float, owned: list[Item], held: Mapping[str, set[str]], live: set[str]
    ) -> tuple[dict[str, Owner], set[str]]:
        """The owner of each shard, and the shards to leave alone this round (their
        ownership item is unreadable and its owner unknown yet); rewrites the unreadable
        items of the shards this node holds."""
        damaged = {i.key[len(SHARD_PREFIX) :]: Beat(i.key, i.version) for i in owned if i.damaged}
        self._unreadable = observe(self._unreadable, damaged, now)
        owners, left = {}, set()
        for i in owned:
            key = i.key[len(SHARD_PREFIX) :]
            node: str | None = str(i.value.get("owner", ""))
            if key in damaged:  # an item no write can name (version 0) is never taken
                stood = now - self._unreadable[key][1] if i.version else 0.0
                node = unreadable_owner(key, self.id, held, live, stood, self.expire_seconds)
                if node == self.id:
                    version = self._rewrite(key, i.version)
                    node = node if version != i.version else None  # else kept, never freed
                    owners[key] = Owner(key, self.id, version)
            if node is None:
                left.add(key)
            owners.setdefault(key, Owner(key, node or "", i.version))
        return owners, left

    def _rewrite(self, key: str, version: int) -> int:
        """Rewrite the unreadable item of a shard owned (not drained: freed then); new version."""
        with self._lock:
            if key not in self._owned or not version:
                return version
        try:
            item = self.store.put(SHARD_PREFIX + key, {"owner": self.id}, version=version)
        except StoreError:
            return version  # changed meanwhile, or the store failed: the next round
        with self._lock:
            if key in self._owned:
                self._owned[key] = item.version
        log.info("fleet.item_rewritten", item=SHARD_PREFIX + key)
        return item.version

    def _take(self, key: str, version: int, now: float, fences: int) -> None:
        """Serve ``key``, owned here at ``version`` as read before the ``fences``-th fence;
        free it if the node cannot."""
        with self._lock:
            if self._fences != fences:  # fenced since the read: its owners may be stale
                return
            self._owned[key] = version
        if self._fence_if_late():  # its snapshot may be older than another node's takeover
            return
        try:
            self.node.add_shard(self._ref(key))
        except (ShardqError, ValueError) as exc:
            log.warning(
                "fleet.cannot_take",
                shard=key,
                error=str(exc),
                detail=f"the fleet assigned it here; freed for another node, tried again "
                f"in {REFUSED_SECONDS:.0f} s",
            )
            with self._lock:
                self._owned.pop(key, None)
                self._refused[key] = now
            self._write(self.store.put, SHARD_PREFIX + key, {"owner": ""}, version=version)
            return
        with self._lock:
            fenced = key not in self._owned  # by the lease watch during the broker call
        if fenced:
            self.node.drop_shard(self._ref(key))
            return
        log.info("fleet.took", shard=key)

    def _settle_drains(self) -> None:
        with self._lock:
            done = [(k, v) for k, (e, v) in self._draining.items() if e.is_set()]
            for key, _ in done:
                del self._draining[key]
        frees = [partial(self._free, key, version) for key, version in done]
        side_by_side(frees, self.parallel, self._beat_now)

    def _free(self, key: str, version: int) -> None:
        if self._write(self.store.put, SHARD_PREFIX + key, {"owner": ""}, version=version):
            log.info("fleet.freed", shard=key)

    def _fence(self) -> None:
        """Stop serving every shard (an elastic node's, held or not): others may take them now."""
        with self._lock:
            owned, self._owned = list(self._owned), {}
            self._fences += 1
        served = [ref.key for ref in self.node.shard_refs()] if self.elastic else []
        for key in {*owned, *served}:
            self.node.drop_shard(self._ref(key))

    def report(self) -> Heartbeat:
        """This node's heartbeat."""
        mode, held = (ELASTIC, self.held()) if self.elastic else (STATIC, None)
        return heartbeat(
            self.node, self._rate, self.clock(), held, node=self.id, started=self.started,
            at=self.wall(), mode=mode, expire=self.expire_seconds, prefix=self.prefix,
        )  # fmt: skip

    def _ref(self, key: str) -> ShardRef:
        name, shard = parse_key(key)
        worker, gen = parse_name(name)
        return ShardRef(worker, shard, self.app.settings(worker).priority, gen)

    def _write(self, call: Callable[..., object], *args: Any, version: int | None) -> bool:
        """A conditional write; a conflict (a stale version) waits for the next round."""
        try:
            call(*args, version=version)
        except StoreConflict:
            return False
        except StoreError as exc:
            log.warning("fleet.store_failed", error=str(exc))
            return False
        return True
