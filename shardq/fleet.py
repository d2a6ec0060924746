"""A node's membership of its app's fleet: shard leases, presence, reports, balance.

**Leases** live in the app's leases queue (``{queue_prefix}shardq-leases.fifo``), a
FIFO queue on the app's own broker (SQS, or the embedded SQLite file):

* one message per shard, in message group ``shard:<worker>:<n>``. A node that
  receives it holds the shard: while the message is in flight no other node can
  receive it. The node renews all its leases together every half *hold*
  (10 per request), each for a hold: ``lease_seconds`` less :data:`TAKEOVER_SECONDS`,
  the time another node needs to receive a lapsed lease, take it and write the fleet
  document. So the shards of a node killed with kill -9 are served again, and shown
  held by others, within ``lease_seconds`` of its death;
* one *presence* message per elastic node, group ``node:<id>``, held and renewed
  with its leases. A presence that becomes visible again long after it was sent
  means its node stopped renewing: whoever receives it records the node as gone.

Every node long-polls the leases queue (one request per 20 s when nothing happens).
A receive hides what it gets for :data:`PROBE_SECONDS` only; the node then decides
for each lease (:func:`~shardq.fleet_rules.take_lease`): take it (and extend it to a
hold) if the fleet document's target for that shard is this node, a node that is
not live, or the node that reported holding it (it let the lease lapse: killed, cut
off or leaving, before the others know); else hand it back after a second for the
target to pick up (and take it anyway once it has come back for
``BOUNCE_GIVE_UP_SECONDS``). A node that
handed something back stays out of the next receive for that long, so the node it
is for gets it rather than the bouncer winning it back. A shard is handed over only
to a target that has reported since this node took it.

**Reports and balance**: every ``report_seconds`` (and at once on join, leave and
takeover) the node rewrites its entry in the fleet document
(:mod:`shardq.fleet_store`), moves nodes silent for :data:`STALE_SECONDS` to gone,
and recomputes the targets (:func:`shardq.assign.assign`: within one of a fair share
of every worker, few moves). A shard whose target is another live node is drained
(:meth:`Node.drop_shard`: running batches finish, held jobs are released in order)
and only then its lease is released.

Safety does not rest on the leases: a job's message stays in flight while any node
holds it (FIFO group locks), so two nodes briefly serving one shard still never run
one entity's jobs at once or out of order. The leases make ownership exclusive in
the normal case, so handovers are quick and balanced.
"""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from shardq.assign import parse_key
from shardq.broker.base import Message, SendEntry, batches
from shardq.errors import BrokerError, ShardqError
from shardq.fleet_doc import ELASTIC, STATIC, FleetDoc, NodeReport
from shardq.fleet_rules import BOUNCE_GIVE_UP_SECONDS, joined, left, shard_keys, take_lease
from shardq.fleet_store import FleetStore, fleet_queue
from shardq.layout import parse_name
from shardq.limits import FIFO_SUFFIX, MAX_BATCH_ENTRIES, MAX_WAIT_SECONDS
from shardq.plan import ShardRef

if TYPE_CHECKING:
    from shardq.node import Node

log = structlog.get_logger("shardq.fleet")

#: Least time between two writes of the fleet document asked for by events (a join,
#: a node gone, a takeover).
EARLY_UPDATE_SECONDS = 2.0
#: At leave, how long to wait for this node's own long poll of the leases queue: it
#: receives the leases just released (SQS cannot cancel it) and must hand them back
#: before the process exits, or they stay hidden for a whole hold.
LEAVE_POLL_SECONDS = 1.0
#: A receive of the leases queue hides what it gets this long; what the node keeps is
#: then extended to a hold (``lease_seconds`` less :data:`TAKEOVER_SECONDS`).
PROBE_SECONDS = 3
#: A lease is hidden for ``lease_seconds`` less this after each renewal: the time
#: another node needs, once the lease lapsed, to receive it (its long poll is open),
#: take it and write the fleet document (at most one write per
#: :data:`EARLY_UPDATE_SECONDS`). So ``lease_seconds`` bounds how long a dead node's
#: shards wait, as the operator sees it.
TAKEOVER_SECONDS = 3.0
#: Seconds a bounced lease stays hidden, giving its target the next receive.
BOUNCE_SECONDS = 1
#: A lease this node handed over and receives back within this many seconds is hidden
#: for :data:`HANDED_BOUNCE_SECONDS`, so the other nodes' receives get it first.
HANDED_SECONDS = 10.0
HANDED_BOUNCE_SECONDS = 3
#: A held lease is given up (its shard dropped) this long before it could expire.
LAPSE_MARGIN_SECONDS = 2.0
SHARD_GROUP, NODE_GROUP, LAYOUT_GROUP = "shard:", "node:", "layout:"
#: An idle elastic node (no job since its last report, the same shards, no lag)
#: reports this often instead of every ``report_seconds``: its presence on the leases
#: queue, not its report, tells the others it is alive.
IDLE_REPORT_SECONDS = 90.0
#: A layout notice (``shardq reshard``) received by this node is hidden this long,
#: so that the other nodes' polls get it too.
NOTICE_BOUNCE_SECONDS = 2


def lease_timing(lease_seconds: float) -> tuple[float, float]:
    """``(hold, renew)``: how long each renewal hides a lease (``lease_seconds`` less
    :data:`TAKEOVER_SECONDS`), and how often leases are renewed: half a hold, and at
    least 2 s before a lease not renewed would be given up (short leases)."""
    hold = lease_seconds - TAKEOVER_SECONDS
    return hold, min(hold / 2, hold - LAPSE_MARGIN_SECONDS - 2)


def leases_queue(queue_prefix: str) -> str:
    """The leases queue of an app with this queue prefix."""
    return f"{queue_prefix}shardq-leases{FIFO_SUFFIX}"


def make_node_id() -> str:
    """``host-pid-xxxx``: unique in a fleet, readable in logs."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    return f"{host[:60] or 'node'}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class Fleet:
    """One node's membership: started by the node, stopped after its shutdown sweep."""

    def __init__(self, node: Node, *, elastic: bool, node_id: str | None = None) -> None:
        self.node = node
        self.app = node.app
        self.broker = node.app.broker
        config = node.app.config
        self.id = node_id or make_node_id()
        self.elastic = elastic
        self.lease_seconds = config.lease_seconds
        self.hold_seconds, self.renew_seconds = lease_timing(self.lease_seconds)
        self.report_seconds = config.report_seconds
        self.store = FleetStore(self.broker, fleet_queue(config.queue_prefix))
        self.queue = leases_queue(config.queue_prefix)
        self.started = time.time()
        self.doc = FleetDoc()
        self.failed = False
        self._lock = threading.Lock()
        self._held: dict[str, Message] = {}  # shard key -> its lease message
        self._expires: dict[str, float] = {}  # shard key -> monotonic lapse time
        self._presence: Message | None = None
        self._dropping: dict[str, threading.Event] = {}
        self._bounced: dict[str, float] = {}  # key -> monotonic time first bounced
        self._handed: dict[str, float] = {}  # key -> monotonic time this node released it
        self._took: dict[str, float] = {}  # key -> Unix time this node took it
        self._gone: dict[str, str] = {}  # node -> reason, to record at the next write
        self._update_now = threading.Event()
        self._stop = threading.Event()
        self._rng = random.Random()
        self._threads: list[threading.Thread] = []
        self._done_before = 0
        self._rate_at = time.monotonic()
        self._last_held: tuple[str, ...] = ()
        self._presence_until = 0.0  # monotonic time the presence's last renewal ends
        self._every = self.report_seconds  # the interval the last report announced
        self._doc_at = 0.0  # monotonic time of the last write of the document
        self._read_at = 0.0  # and of the last look at it (_refresh)
        self._presence_sent = 0.0
        self._keys_known: set[str] = set()  # the live layout's keys the leases were made for
        self._retiring: set[str] = set()  # held keys of a retired layout, being dropped

    # -- life -----------------------------------------------------------------------
    def join(self) -> None:
        """Create what is missing, enter the document, start the threads. Broker errors
        propagate (the node does not start)."""
        self.store.ensure()
        if self.elastic:
            self.broker.ensure_queue(self.queue, visibility_timeout=int(self.lease_seconds))
            self._create_leases()
            self._send_presence()
        self._update()
        log.info("fleet.joined", node=self.id, mode=ELASTIC if self.elastic else STATIC)
        loops = [("shardq-fleet", self._keep)]
        if self.elastic:
            loops.append(("shardq-fleet-poll", self._poll))
        for name, target in loops:
            thread = threading.Thread(target=self._guard, args=(target,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def alive(self) -> bool:
        return self._stop.is_set() or all(t.is_alive() for t in self._threads)

    def leave(self) -> None:
        """After the node's shutdown sweep: leave the document, hand every lease back."""
        with self._lock:
            self._stop.set()
        try:
            shards = self._shards()
            self.store.update(lambda d: left(d, self.id, time.time(), shards), timeout=5.0)
        except ShardqError as exc:
            log.warning("fleet.leave_failed", error=str(exc))
        with self._lock:
            leases = list(self._held.values())
            presence, self._presence = self._presence, None
            self._held.clear()
        self._release(leases, 0)
        if presence is not None:
            self._safely("delete", lambda: self.broker.delete_batch(self.queue, [presence.receipt]))
        for thread in self._threads:  # the poller releases what its open poll receives
            if thread.name == "shardq-fleet-poll" and thread is not threading.current_thread():
                thread.join(LEAVE_POLL_SECONDS)
        log.info("fleet.left", node=self.id, released=len(leases))

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def live_nodes(self) -> set[str]:
        """Elastic nodes of the last document read, less those seen gone."""
        return self._live()

    # -- the keeper: renewals, reports, balance ----------------------------------------
    def _keep(self) -> None:
        next_renew = time.monotonic() + self.renew_seconds
        next_report = time.monotonic() + self._report_interval()
        next_look = time.monotonic() + 5.0
        while not self._stop.wait(0.25) and not self.node.stopping.is_set():
            now = time.monotonic()
            if self.elastic and now >= next_renew:
                next_renew = now + (self.renew_seconds if self._renew() else 1.0)
            if self.elastic:
                self._drop_lapsed()
                self._resend_presence()
            if self._every > self.report_seconds and now >= next_look:
                next_look = now + 5.0
                self._wake_if_busy()  # an idle node that runs jobs again reports them
            early = self._update_now.is_set() and now - self._doc_at >= EARLY_UPDATE_SECONDS
            if now >= next_report or early:
                self._update_now.clear()
                next_report = now + (self._report_interval() if self._try_update() else 2.0)
            if self.elastic:
                self._follow_layout()
                self._balance()

    def _report_interval(self) -> float:
        return self._every * self._rng.uniform(0.85, 1.0)

    def _wake_if_busy(self) -> None:
        tally = self.node.tally()
        done = sum(tally.succeeded.values()) + sum(tally.morgued.values())
        if done != self._done_before or self.held() != list(self._last_held):
            self._update_now.set()

    def _renew(self) -> bool:
        """Renew every lease held, and the presence. The presence rides in the last
        batch when there is room; when the leases fill their batches (a multiple of 10)
        it is renewed every other round instead, for 1.5 holds, not costing a request
        of its own each round."""
        sent = time.monotonic()
        next_round = sent + self.renew_seconds + LAPSE_MARGIN_SECONDS
        with self._lock:
            entries = [(k, m) for k, m in self._held.items()]
            room = len(entries) % MAX_BATCH_ENTRIES != 0
            if self._presence is not None and (room or next_round >= self._presence_until):
                entries.append(("", self._presence))
        presence_seconds = self.hold_seconds if room else int(self.hold_seconds * 1.5)
        ok = True
        for chunk in batches(entries):
            try:
                result = self.broker.change_visibility_batch(
                    self.queue,
                    [
                        (m.receipt, presence_seconds if not k else self.hold_seconds)
                        for k, m in chunk
                    ],
                )
            except BrokerError as exc:
                log.warning("fleet.renew_failed", error=str(exc))
                self.node.broker_trouble("renew", self.queue, exc)
                ok = False
                continue
            for key, message in chunk:
                if message.receipt in result.failed:
                    self._lost(key, result.failed[message.receipt])
                elif key:
                    with self._lock:
                        if key in self._held:
                            self._expires[key] = sent + self.hold_seconds
                else:
                    self._presence_until = sent + presence_seconds
        return ok

    def _lost(self, key: str, reason: str) -> None:
        """A lease the broker no longer lets us renew: another node may hold it now."""
        if not key:
            log.warning("fleet.presence_lost", node=self.id, reason=reason)
            with self._lock:
                self._presence = None
            self._send_presence()
            self._update_now.set()
            return
        log.warning("fleet.lease_lost", shard=key, reason=reason)
        with self._lock:
            self._held.pop(key, None)
            self._expires.pop(key, None)
        self.node.drop_shard(self._ref_any(key))

    def _drop_lapsed(self) -> None:
        now = time.monotonic()
        with self._lock:
            lapsed = [k for k, t in self._expires.items() if now > t - LAPSE_MARGIN_SECONDS]
        for key in lapsed:
            self._lost(key, "not renewed in time (the broker did not answer)")

    def _resend_presence(self) -> None:
        """A presence not received back within half a hold (others took it for stale,
        or it was lost) is sent again."""
        with self._lock:
            missing = self._presence is None
        if missing and time.monotonic() - self._presence_sent > self.hold_seconds / 2:
            self._send_presence()

    def _follow_layout(self) -> None:
        """A reshard changed the shards: leases for the new ones; the old ones drained,
        then their leases deleted."""
        keys = set(self._keys())
        if keys - self._keys_known:
            try:
                self._create_leases()
            except ShardqError as exc:
                log.warning("fleet.create_leases_failed", error=str(exc))
                return
            self._update_now.set()
        self._keys_known = keys
        with self._lock:
            gone = [k for k in self._held if k not in keys and k not in self._retiring]
        for key in gone:
            if self._retired(key):
                log.info("fleet.retiring", shard=key, detail="its layout generation ended")
                self._retiring.add(key)
                self._dropping[key] = self.node.drop_shard(self._ref_any(key))

    def _retired(self, key: str) -> bool:
        """Whether ``key`` is a shard of an older generation of a worker this node has."""
        try:
            name, _ = parse_key(key)
            worker, gen = parse_name(name)
        except (ValueError, ShardqError):
            return False
        if worker not in self.app.workers:
            return False
        return gen < self.app.layouts.cached(worker).gen and name not in self._shards()

    def _balance(self) -> None:
        """Drain shards targeted at another live node; release their leases once drained."""
        live = self._live()
        with self._lock:
            held = [k for k in self._held if k not in self._retiring]
        for key in held:
            target = self.doc.targets.get(key)
            report = self.doc.nodes.get(target or "")
            # only to a target that reported since this node took the shard: a target
            # that died unnoticed would otherwise get it back and leave it unserved
            alive = report is not None and report.seen > self._took.get(key, 0.0)
            if target != self.id and target in live and alive and key not in self._dropping:
                log.info("fleet.handing_over", shard=key, to=target)
                self._dropping[key] = self.node.drop_shard(self._ref_any(key))
        for key, drained in list(self._dropping.items()):
            if drained.is_set():
                del self._dropping[key]
                with self._lock:
                    message = self._held.pop(key, None)
                    self._expires.pop(key, None)
                if message is not None and key in self._retiring:
                    self._retiring.discard(key)
                    self._delete_lease(message)
                elif message is not None:
                    self._handed[key] = time.monotonic()
                    self._release([message], 0)

    # -- the document ---------------------------------------------------------------
    def _try_update(self) -> bool:
        try:
            self._update()
            return True
        except ShardqError as exc:
            log.warning("fleet.report_failed", error=str(exc))
            return False

    def _update(self) -> None:
        report, gone, shards = self._report(time.time()), dict(self._gone), self._shards()
        self.doc = self.store.update(lambda d: joined(d, report, gone, time.time(), shards))
        self._doc_at = self._read_at = time.monotonic()
        for node in list(self._gone):
            if node in self.doc.gone or node not in self.doc.nodes:
                self._gone.pop(node, None)

    def _refresh(self) -> None:
        """A fresh look at the document (one peek), at most every 2 s."""
        if time.monotonic() - self._read_at < 2.0:
            return
        self._read_at = time.monotonic()
        try:
            self.doc = self.store.read(timeout=2.0) or self.doc
        except ShardqError as exc:
            log.warning("fleet.read_failed", error=str(exc))

    def _report(self, now: float) -> NodeReport:
        lags = {f"{w}:{s}": round(lag, 3) for w, s, lag in self.node.lags()}
        tally = self.node.tally()
        done = sum(tally.succeeded.values()) + sum(tally.morgued.values())
        elapsed = max(1e-3, time.monotonic() - self._rate_at)
        rate = (done - self._done_before) / elapsed
        self._done_before, self._rate_at = done, time.monotonic()
        held = self.held() if self.elastic else sorted(lags)
        quiet = (  # nothing done since the last report, the same shards, no lag
            self.elastic and rate == 0 and tuple(held) == self._last_held and not any(lags.values())
        )
        self._every = IDLE_REPORT_SECONDS if quiet else self.report_seconds
        self._last_held = tuple(held)
        return NodeReport(
            node=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            seen=now,
            mode=ELASTIC if self.elastic else STATIC,
            threads=len(self.node.lanes),
            held=tuple(held),
            lags={k: v for k, v in lags.items() if k in set(held)},
            jobs_per_second=round(rate, 2),
            done=done,
            max_lag=max(lags.values(), default=0.0),
            version=_version(),
            every=self._every,
        )

    def _live(self) -> set[str]:
        """Elastic nodes of the document, less those this node has seen go."""
        return {n for n, r in self.doc.nodes.items() if r.mode == ELASTIC} - set(self._gone)

    # -- the poller: receiving leases and presences ---------------------------------------
    def _poll(self) -> None:
        backoff = 0.5
        while not self._stop.is_set() and not self.node.stopping.is_set():
            try:
                messages = self.broker.receive(
                    self.queue,
                    max_messages=MAX_BATCH_ENTRIES,
                    wait_seconds=MAX_WAIT_SECONDS,
                    visibility_timeout=PROBE_SECONDS,
                )
            except BrokerError as exc:
                self.node.broker_trouble("receive", self.queue, exc)
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)
                continue
            backoff = 0.5
            if self._stop.is_set() or self.node.stopping.is_set():
                self._release(messages, 0)
                return
            bounced = self._received(messages)
            if bounced:  # out of the race for what it bounced: its node gets it first
                self._stop.wait(bounced + self._rng.uniform(0.1, 0.4))

    def _received(self, messages: Sequence[Message]) -> float:
        """Sort one receive out: keep, bounce, delete. Returns the shortest time it
        bounced something for (0 if nothing): the poller does not race the node that
        thing is for (a bouncer polling again at once would win it back, time after
        time, on a broker that hands a message to the first receive that asks)."""
        firsts: dict[str, Message] = {}
        extra: list[Message] = []  # copies of a lease (a node start after the dedup window)
        newest: dict[str, float] = {}  # group -> its youngest message's send time
        for message in messages:
            newest[message.group_id] = max(newest.get(message.group_id, 0.0), message.sent_at)
            if message.group_id in firsts:
                extra.append(message)
            else:
                firsts[message.group_id] = message
        if extra:
            receipts = [m.receipt for m in extra]
            self._safely("delete", lambda: self.broker.delete_batch(self.queue, receipts))
        bounce: list[Message] = []
        notices: list[Message] = []  # layout notices, for the other nodes too
        slow: list[Message] = []  # leases this node just handed over
        keep: list[tuple[str, Message]] = []  # shard key ("" for its own presence)
        # presences first: a node found gone here frees its leases in the same batch
        for group, message in sorted(firsts.items(), key=lambda g: not g[0].startswith(NODE_GROUP)):
            if group.startswith(NODE_GROUP):
                self._presence_seen(group[len(NODE_GROUP) :], message, newest[group], bounce, keep)
            elif group.startswith(SHARD_GROUP):
                self._lease_seen(group[len(SHARD_GROUP) :], message, bounce, slow, keep)
            elif group.startswith(LAYOUT_GROUP):
                self._notice_seen(message, notices)
            else:
                bounce.append(message)
        self._release(bounce, BOUNCE_SECONDS)
        self._release(slow, HANDED_BOUNCE_SECONDS)
        self._release(notices, NOTICE_BOUNCE_SECONDS)
        for key, message, claimed_at in self._claim(keep):
            if key:
                self._take(key, message, claimed_at + self.hold_seconds)
            else:
                with self._lock:
                    self._presence = message
                    self._presence_until = claimed_at + self.hold_seconds
        pauses = [
            seconds
            for seconds, released in (
                (BOUNCE_SECONDS, bounce),
                (HANDED_BOUNCE_SECONDS, slow),
                (NOTICE_BOUNCE_SECONDS, notices),
            )
            if released
        ]
        return float(min(pauses, default=0))

    def _claim(self, keep: list[tuple[str, Message]]) -> list[tuple[str, Message, float]]:
        """Extend what this node keeps from the probe's short visibility to a hold (a
        receive hides for :data:`PROBE_SECONDS` only, so an abandoned long poll, on a
        broker that completes it after its client died, cannot hide a lease for long).
        Each claimed message comes with the monotonic time its extension was sent."""
        claimed = []
        for chunk in batches(keep):
            sent = time.monotonic()
            try:
                result = self.broker.change_visibility_batch(
                    self.queue, [(m.receipt, self.hold_seconds) for _, m in chunk]
                )
            except BrokerError as exc:
                self.node.broker_trouble("claim", self.queue, exc)
                continue
            for key, message in chunk:
                if message.receipt in result.failed:
                    log.info(
                        "fleet.claim_lost", shard=key or None, reason=result.failed[message.receipt]
                    )
                else:
                    claimed.append((key, message, sent))
        return claimed

    def _presence_seen(
        self,
        node: str,
        message: Message,
        newest: float,
        bounce: list[Message],
        keep: list[tuple[str, Message]],
    ) -> None:
        """``newest``: when the youngest presence of ``node`` in this receive was sent (a
        node that did not get its presence back within half a hold sent another: it
        lives, though the first, which it will keep, is older)."""
        if node == self.id:
            keep.append(("", message))
            return
        if time.time() - newest < self.lease_seconds + 5:
            bounce.append(message)  # just sent: its node has not received it yet
            if node not in self.doc.nodes:
                self._update_now.set()  # a node joined: rebalance without waiting a report
            return
        log.warning("fleet.node_gone", node=node, reason="lease expired")
        self._safely("delete", lambda: self.broker.delete_batch(self.queue, [message.receipt]))
        self._gone[node] = "lease expired"
        self._update_now.set()

    def _notice_seen(self, message: Message, notices: list[Message]) -> None:
        """``shardq reshard`` began a reshard: read the layout now. The notice stays
        for the other nodes until its time is over, then it is deleted."""
        self.node.layout.poke()
        try:
            until = float(json.loads(message.body).get("until", 0))
        except (ValueError, TypeError, AttributeError):
            until = 0.0
        if time.time() < until:
            notices.append(message)
        else:
            self._delete_lease(message)

    def _lease_seen(
        self,
        key: str,
        message: Message,
        bounce: list[Message],
        slow: list[Message],
        keep: list[tuple[str, Message]],
    ) -> None:
        try:
            self._ref(key)
        except (ValueError, ShardqError):
            if self._retired(key):  # a lease of a layout generation that ended
                self._delete_lease(message)
            else:
                bounce.append(message)  # a worker this node's code does not have (yet)
            return
        now = time.monotonic()
        target = self.doc.targets.get(key)
        handed = now - self._handed.get(key, -HANDED_SECONDS) < HANDED_SECONDS
        if handed and target != self.id and target in self._live():
            slow.append(message)  # handed over just now: the target's turn
            return
        first = self._bounced.get(key)
        if first is not None and now - first > 3 * BOUNCE_GIVE_UP_SECONDS:
            first = None  # an old bounce: the lease has had other holders since
        bounced_for = None if first is None else now - first
        if target not in (None, self.id) and target in self._live():
            self._refresh()  # the target may have changed, gone, or be handed it just now
        if not take_lease(key, self.id, self.doc, self._live(), bounced_for):
            self._bounced[key] = now if first is None else first
            bounce.append(message)
            return
        self._bounced.pop(key, None)
        keep.append((key, message))

    def _take(self, key: str, message: Message, expires: float) -> None:
        ref = self._ref(key)
        with self._lock:
            leaving = self._stop.is_set()  # leave() may have swept already
            if not leaving:
                self._held[key] = message
                self._expires[key] = expires
                self._took[key] = time.time()
        if leaving:
            self._release([message], 0)
            return
        try:
            self.node.add_shard(ref)
        except ShardqError as exc:
            log.warning("fleet.add_failed", shard=key, error=str(exc))
            with self._lock:
                self._held.pop(key, None)
                self._expires.pop(key, None)
            self._release([message], 0)
            return
        log.info("fleet.took", shard=key, target=self.doc.targets.get(key))
        self._update_now.set()  # the document shows the new holder within seconds

    # -- helpers ------------------------------------------------------------------------
    def _shards(self) -> dict[str, int]:
        """Shards of the live layout by generation name (``Orders``, ``Orders@2``)."""
        return {
            name: count
            for worker in self.app.workers
            for name, count in self.app.live_shards(worker).items()
        }

    def _keys(self) -> list[str]:
        return shard_keys(self._shards())

    def _ref(self, key: str) -> ShardRef:
        """The shard of ``key`` in the live layout (ValueError if it is not in it)."""
        ref = self._ref_any(key)
        count = self._shards().get(ref.name, 0)
        if not 0 <= ref.shard < count:
            raise ValueError(f"shard {ref.shard} of {ref.name} is not in the live layout")
        return ref

    def _ref_any(self, key: str) -> ShardRef:
        name, shard = parse_key(key)
        worker, gen = parse_name(name)
        return ShardRef(worker, shard, self.app.settings(worker).priority, gen)

    def _create_leases(self) -> None:
        """Send the lease message of every shard the document does not list yet."""
        doc = self.store.read() or FleetDoc()
        keys = self._keys()
        counts = self.broker.counts(self.queue)
        if counts.waiting + counts.in_flight < len(keys):  # (re)created queue: send all
            missing = keys  # a lease that exists is deduplicated (or its copy deleted later)
        else:
            missing = [k for k in keys if k not in set(doc.leases)]
        entries = [
            SendEntry(
                str(i), json.dumps({"kind": "shard", "key": k}), SHARD_GROUP + k, "lease-" + k
            )
            for i, k in enumerate(missing)
        ]
        for chunk in batches(entries):
            result = self.broker.send_batch(self.queue, chunk)
            if result.failed:
                raise BrokerError(f"creating shard leases failed: {result.failed}")

    def _send_presence(self) -> None:
        self._presence_sent = time.monotonic()
        body = json.dumps({"kind": "node", "node": self.id, "started": self.started})
        entry = SendEntry("0", body, NODE_GROUP + self.id, uuid.uuid4().hex)
        self._safely("send", lambda: self.broker.send_batch(self.queue, [entry]))

    def _delete_lease(self, message: Message) -> None:
        self._safely("delete", lambda: self.broker.delete_batch(self.queue, [message.receipt]))

    def _release(self, messages: Sequence[Message], seconds: float) -> None:
        for chunk in batches(list(messages)):
            self._safely(
                "release",
                lambda c=chunk: self.broker.change_visibility_batch(  # type: ignore[misc]
                    self.queue, [(m.receipt, float(seconds)) for m in c]
                ),
            )

    def _safely(self, operation: str, call: Callable[[], object]) -> None:
        try:
            call()
        except BrokerError as exc:
            self.node.broker_trouble(operation, self.queue, exc)

    def _guard(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as exc:
            self.failed = True
            self.node.fail("the fleet membership", exc)


def _version() -> str:
    from shardq import __version__

    return __version__
