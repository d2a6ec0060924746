"""The embedded broker: SQS FIFO semantics on a local SQLite file.

* Durable across ``kill -9`` (WAL journal, every call is one transaction: a call
  that fails stored nothing).
* Safe for several node processes on one machine (``BEGIN IMMEDIATE`` plus a busy
  timeout serialise writers).
* Every SQLite error becomes a :class:`~shardq.errors.BrokerError` naming the file
  and what to do (a full disk says so).
* A receive costs the same on any queue: it walks the heads of the queue's message
  groups (see :mod:`shardq.broker.sqlite_store`), not the messages behind a blocked
  head, so no call holds the broker's lock for long.
* A receive that waits wakes as soon as a message may be receivable: at once for
  writes of its queue from this process (only that queue's waiters are woken);
  within ``poll_interval`` (25 ms) for writes from other processes (see
  :mod:`shardq.broker.sqlite_wait`); and when a blocked group's visibility ends.
  :meth:`SqliteBroker.watch` waits on many queues at once the same way.
* Deduplication ids are kept their 5 minutes in one table per minute of sends,
  dropped whole once expired (see :mod:`shardq.broker.sqlite_dedup`).
* :meth:`SqliteBroker.maintain` (the node calls it about every 30 s) drops expired
  deduplication buckets, gives freed pages back to the disk and truncates the WAL;
  :func:`compact` rewrites a file by hand.

:class:`MemoryBroker` is the same engine on an in-memory database: no file, for
unit tests.

Test-only: ``reopen_groups=True`` (URL parameter ``test_reopen_groups=1``) emulates
a known defect of LocalStack's SQS FIFO emulation, so ordering tests can check that
shardq copes with it. When a visibility change releases a message of group G (to
visibility 0) while another message of G is still in flight, G is "reopened":
receives ignore G's in-flight messages when deciding whether G is blocked, so G's
visible later messages can be received out of order, until a receive returns a
message of G (which blocks it again as usual). Never use it in production.

Test-only: ``stale_visibility=True`` (URL parameter ``test_stale_visibility=1``)
emulates another emulator's behaviour: a message that was received and became
visible again (its visibility expired or was changed) stays hidden while an older
message of its queue is in flight. Never use it in production.
"""

from __future__ import annotations

import functools
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from shardq.broker.base import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
    check_batch,
    check_send_batch,
    entry_problem,
)
from shardq.broker.sqlite_dedup import DedupIds
from shardq.broker.sqlite_store import VACUUM_CHUNK, checkpoint, compact, error, open_db
from shardq.broker.sqlite_wait import OtherProcesses, Waiters
from shardq.errors import BrokerError, QueueNotFoundError
from shardq.limits import (
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE_BYTES,
    MAX_VISIBILITY_SECONDS,
    MIN_MESSAGE_BYTES,
)

__all__ = ["MemoryBroker", "SqliteBroker", "compact"]

# A receive returns the oldest receivable messages, in send order: it walks the
# receivable groups in head order, then reads only the messages that can be among
# the oldest. Short indexed queries, however long the backlog behind any group.
_COLUMNS = "seq, group_id, body, message_id, sent_at, receive_count"
# The receivable groups in head order, each with its head message (visible unless
# the group was reopened, a test-only mode) and the seq of the message after it.
_RECEIVABLE_GROUPS = """
SELECT g.head_seq, g.reopened, m.visible_at,
    (SELECT seq FROM messages AS s
     WHERE s.queue = g.queue AND s.group_id = g.group_id AND s.seq > g.head_seq
     ORDER BY s.seq LIMIT 1),
    m.seq, m.group_id, m.body, m.message_id, m.sent_at, m.receive_count
FROM groups AS g JOIN messages AS m ON m.seq = g.head_seq
WHERE g.queue = ? AND (g.blocked_until <= ? OR g.reopened) ORDER BY g.head_seq LIMIT ?
"""
_GROUP_SEQS = """
SELECT seq FROM messages
WHERE queue = ? AND group_id = ? AND +visible_at <= ? AND seq <= ? ORDER BY seq LIMIT ?
"""
_NEXT_UNBLOCKED = "SELECT MIN(blocked_until) FROM groups WHERE queue = ? AND blocked_until > ?"
_KNOWN_GROUPS = """
SELECT j.value FROM json_each(?1) AS j
WHERE EXISTS (SELECT 1 FROM messages WHERE queue = ?2 AND group_id = j.value)
"""
# For each group (``{rows}``: one ``(?, ?, ?)`` (group, first deleted seq or null,
# order) each): its head now, and the latest visibility of its messages that may be
# in flight: only messages received at some time can be, and those are at most its
# ``last_received``. The group's row is found by its old head (the first deleted
# message, if that came first).
_GROUP_STATE = """
WITH d(grp, gone, n) AS (VALUES {rows}),
h AS (
    SELECT grp, gone, n, (SELECT seq FROM messages WHERE queue = ? AND group_id = grp
                          ORDER BY seq LIMIT 1) AS head
    FROM d)
SELECT h.grp, h.head, g.head_seq,
    (SELECT MAX(visible_at) FROM messages
     WHERE queue = ? AND group_id = h.grp AND seq <= g.last_received)
FROM h JOIN groups AS g ON g.queue = ? AND g.head_seq = CASE
    WHEN h.gone IS NULL THEN h.head WHEN h.head IS NULL THEN h.gone
    ELSE min(h.gone, h.head) END
ORDER BY h.n
"""
_READY = """
SELECT j.value FROM json_each(:qs) AS j WHERE EXISTS (
    SELECT 1 FROM groups AS g
    WHERE g.queue = j.value AND (g.blocked_until <= :now OR g.reopened))
"""
_NEXT_READY = """
SELECT MIN(g.blocked_until) FROM json_each(:qs) AS j JOIN groups AS g ON g.queue = j.value
WHERE g.blocked_until > :now
"""
#: Queues checked per hold of the broker's lock by :meth:`SqliteBroker.watch`.
_WATCH_CHUNK = 200
_STALE = "receipt handle is invalid or expired (the message is visible again or was deleted)"


_END = 2**63 - 1  # no seq is larger


def _stale_hidden(
    db: sqlite3.Connection, queue: str, now: float, rows: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], float | None]:
    """Test-only (``stale_visibility``): ``rows`` less the messages received before
    that an older in-flight message of the queue keeps hidden (and their groups'
    later messages); with when the oldest in-flight message becomes visible."""
    oldest, until = db.execute(
        "SELECT MIN(seq), MIN(visible_at) FROM messages"
        " WHERE queue = ? AND visible_at > ? AND receive_count > 0",
        (queue, now),
    ).fetchone()
    if oldest is None:
        return rows, None
    kept, stuck = [], set()
    for row in rows:  # seq, group_id, body, message_id, sent_at, receive_count, head
        if row[1] in stuck or (row[5] > 0 and row[0] > oldest):
            stuck.add(row[1])
        else:
            kept.append(row)
    return kept, until


@functools.lru_cache(maxsize=MAX_BATCH_ENTRIES)
def _group_state(count: int) -> str:
    return _GROUP_STATE.format(rows=",".join(["(?, ?, ?)"] * count))


def _marks(count: int) -> str:
    return ",".join("?" * count)


class SqliteBroker(Broker):
    """The embedded broker on the SQLite file ``path`` (created if missing).

    ``allow_other_tables`` lets it share a file that holds other applications'
    tables (refused by default, so a mistyped ``broker_url`` cannot quietly add
    shardq's tables to an application database). ``reopen_groups`` is test-only
    (see the module docstring).
    """

    kind = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        poll_interval: float = 0.025,
        reopen_groups: bool = False,
        stale_visibility: bool = False,
        allow_other_tables: bool = False,
    ) -> None:
        self.path = path
        self.reopen_groups = reopen_groups
        self.stale_visibility = stale_visibility
        self._poll_interval = poll_interval
        self._lock = threading.RLock()
        self._db = open_db(path, allow_other_tables=allow_other_tables)
        self._queue_cache: dict[str, tuple[float, int]] = {}
        self._dedup = DedupIds()
        self._waiters = Waiters()
        self._closed = False
        self._watcher: OtherProcesses | None = None

    # -- transactions -------------------------------------------------------
    @contextmanager
    def _tx(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; any SQLite error rolls it back whole."""
        with self._lock:
            db = self._open_db()
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise error(self.path, exc, doing) from exc
            try:
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error):
                    raise error(self.path, exc, doing) from exc
                raise

    @contextmanager
    def _read(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection for reads outside a write transaction."""
        with self._lock:
            db = self._open_db()
            try:
                yield db
            except sqlite3.Error as exc:
                raise error(self.path, exc, doing) from exc

    def _open_db(self) -> sqlite3.Connection:
        if self._closed:
            raise BrokerError(f"the embedded broker on {self.path} is closed; make a new one")
        return self._db

    def _rollback(self) -> None:
        # SQLite may have rolled back already (it may, e.g. when the disk is full)
        with suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")

    # -- queues -------------------------------------------------------------
    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        size = MAX_MESSAGE_BYTES if max_message_bytes is None else max_message_bytes
        if not MIN_MESSAGE_BYTES <= size <= MAX_MESSAGE_BYTES:
            raise BrokerError(
                f"max_message_bytes {size} for queue {name} is outside "
                f"{MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES}"
            )
        with self._tx(f"creating queue {name}") as db:
            db.execute(
                "INSERT OR IGNORE INTO queues (name, visibility_timeout, max_message_bytes, salt)"
                " VALUES (?, ?, ?, randomblob(16))",
                (name, float(visibility_timeout), size),
            )

    def _queue(self, db: sqlite3.Connection, name: str) -> tuple[float, int]:
        cached = self._queue_cache.get(name)
        if cached is not None:
            return cached
        row = db.execute(
            "SELECT visibility_timeout, max_message_bytes FROM queues WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            raise QueueNotFoundError(
                f"queue {name} does not exist in {self.path}; create it with "
                "`shardq queues ensure` or publish through the app"
            )
        self._queue_cache[name] = (float(row[0]), int(row[1]))
        return self._queue_cache[name]

    def delete_queue(self, queue: str) -> None:
        with self._tx(f"deleting queue {queue}") as db:
            db.execute("DELETE FROM messages WHERE queue = ?", (queue,))
            db.execute("DELETE FROM groups WHERE queue = ?", (queue,))
            db.execute("DELETE FROM queues WHERE name = ?", (queue,))
        self._queue_cache.pop(queue, None)

    def max_message_bytes(self, queue: str) -> int:
        with self._read(f"reading queue {queue}") as db:
            return self._queue(db, queue)[1]

    def counts(self, queue: str) -> QueueCounts:
        now = time.time()
        with self._read(f"counting queue {queue}") as db:
            self._queue(db, queue)
            waiting, in_flight = db.execute(
                "SELECT COALESCE(SUM(visible_at <= :now), 0), COALESCE(SUM(visible_at > :now), 0)"
                " FROM messages WHERE queue = :q",
                {"q": queue, "now": now},
            ).fetchone()
            oldest = db.execute(
                "SELECT MIN(sent_at) FROM messages WHERE seq ="
                " (SELECT MIN(head_seq) FROM groups WHERE queue = ?)",
                (queue,),
            ).fetchone()[0]
            row = db.execute("SELECT deleted FROM queues WHERE name = ?", (queue,)).fetchone()
        if row is None:  # deleted by another process since this one looked it up
            self._queue_cache.pop(queue, None)
            raise QueueNotFoundError(f"queue {queue} was deleted from {self.path}")
        return QueueCounts(int(waiting), int(in_flight), oldest, int(row[0]))

    def queue_settings(self, queue: str) -> QueueSettings | None:
        with self._read(f"reading queue {queue}") as db:
            row = db.execute(
                "SELECT visibility_timeout, max_message_bytes FROM queues WHERE name = ?", (queue,)
            ).fetchone()
        if row is None:
            return None
        return QueueSettings(True, int(row[0]), int(row[1]), False)

    # -- send ---------------------------------------------------------------
    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        check_send_batch(entries)
        result = SendResult()
        now = time.time()
        version = None
        with self._tx(f"sending to queue {queue}") as db:
            _, max_bytes = self._queue(db, queue)
            fresh = []
            for entry in entries:
                reason = entry_problem(entry, max_bytes)
                if reason:
                    result.failed[entry.id] = reason
                else:
                    fresh.append(entry)
            if fresh:
                self._store(db, queue, fresh, now, result)
            if result.message_ids:
                version = self._bump(db, queue)
        if version is not None:
            self._waiters.wrote({queue: version})
        return result

    def _store(
        self,
        db: sqlite3.Connection,
        queue: str,
        entries: list[SendEntry],
        now: float,
        result: SendResult,
    ) -> None:
        """Store the entries whose deduplication id is new, in order, with their groups."""
        ids, fresh = self._dedup.claim(db, queue, list(dict.fromkeys(e.dedup_id for e in entries)))
        new: list[tuple[SendEntry, str]] = []
        for entry in entries:
            if entry.dedup_id in fresh:  # the first entry with this id
                fresh.discard(entry.dedup_id)
                new.append((entry, ids[entry.dedup_id]))
            result.message_ids[entry.id] = ids[entry.dedup_id]
        if not new:
            return
        groups = list(dict.fromkeys(e.group_id for e, _ in new))
        known = {
            row[0] for row in db.execute(_KNOWN_GROUPS, (json.dumps(groups), queue)).fetchall()
        }
        rows = db.execute(
            "INSERT INTO messages (queue, group_id, body, message_id, sent_at, visible_at)"
            f" VALUES {','.join(['(?, ?, ?, ?, ?, ?)'] * len(new))} RETURNING seq, message_id",
            [v for e, mid in new for v in (queue, e.group_id, e.body, mid, now, now)],
        ).fetchall()
        seqs = dict((message_id, seq) for seq, message_id in rows)
        heads = {}
        for entry, message_id in new:
            if entry.group_id not in known and entry.group_id not in heads:
                heads[entry.group_id] = seqs[message_id]  # the group's first message
        db.executemany(
            "INSERT INTO groups (queue, head_seq, group_id, blocked_until) VALUES (?, ?, ?, ?)",
            [(queue, seq, group, now) for group, seq in heads.items()],
        )

    # -- receive ------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
            raise BrokerError(f"max_messages {max_messages} is outside 1..{MAX_BATCH_ENTRIES}")
        if not 0 <= visibility_timeout <= MAX_VISIBILITY_SECONDS:
            raise BrokerError(f"visibility_timeout {visibility_timeout} is outside 0..43200")
        if wait_seconds <= 0:
            return self._receive_now(queue, max_messages, visibility_timeout)[0]
        deadline = time.monotonic() + wait_seconds
        waiter = self._waiters.add([queue])  # before the first look: no write is missed
        try:
            self._start_watcher()
            while True:
                waiter.event.clear()
                messages, next_visible = self._receive_now(queue, max_messages, visibility_timeout)
                remaining = deadline - time.monotonic()
                if messages or remaining <= 0 or waiter.woken:
                    return messages
                if next_visible is not None:
                    remaining = min(remaining, max(0.0, next_visible - time.time()) + 0.001)
                waiter.event.wait(remaining)
        finally:
            self._waiters.remove(waiter)

    def _receive_now(
        self, queue: str, max_messages: int, visibility_timeout: float
    ) -> tuple[list[Message], float | None]:
        now = time.time()
        visible_at = now + visibility_timeout
        with self._tx(f"receiving from queue {queue}") as db:
            self._queue(db, queue)
            rows = self._receivable(db, queue, now, max_messages)
            if rows and self.stale_visibility:
                rows, hint = _stale_hidden(db, queue, now, rows)
                if not rows:
                    return [], hint
            if not rows:
                return [], db.execute(_NEXT_UNBLOCKED, (queue, now)).fetchone()[0]
            token = secrets.token_hex(8)
            seqs = [row[0] for row in rows]
            db.execute(
                "UPDATE messages SET visible_at = ?, received_at = ?, token = ?,"
                f" receive_count = receive_count + 1 WHERE seq IN ({_marks(len(seqs))})",
                (visible_at, now, token, *seqs),
            )
            last: dict[int, int] = {}  # head -> the group's last message received
            for row in rows:
                last[row[6]] = max(row[0], last.get(row[6], 0))
            db.executemany(
                "UPDATE groups SET blocked_until = max(blocked_until, ?), reopened = 0,"
                " last_received = max(last_received, ?) WHERE queue = ? AND head_seq = ?",
                [(visible_at, seq, queue, head) for head, seq in last.items()],
            )
        return [
            Message(
                queue=queue,
                message_id=message_id,
                receipt=f"{seq}.{token}",
                body=body,
                group_id=group_id,
                receive_count=count + 1,
                sent_at=sent_at,
                sequence=f"{seq:020d}",
                received_at=now,
            )
            for seq, group_id, body, message_id, sent_at, count, _ in rows
        ], None

    def _receivable(
        self, db: sqlite3.Connection, queue: str, now: float, limit: int
    ) -> list[tuple[Any, ...]]:
        """Up to ``limit`` messages to receive, each with its group's head."""
        groups = db.execute(_RECEIVABLE_GROUPS, (queue, now, limit)).fetchall()
        rows: dict[int, tuple[Any, ...]] = {}  # seq -> message columns and group head
        present: list[tuple[str, int, int, int | None]] = []  # group, head, first, second
        for head, reopened, visible_at, second, *message in groups:
            if visible_at <= now:
                rows[head] = (*message, head)
                present.append((message[1], head, head, second))
            elif reopened:  # test-only mode: the head is in flight, a later one is not
                seqs = [r[0] for r in db.execute(_GROUP_SEQS, (queue, message[1], now, _END, 2))]
                if seqs:
                    present.append((message[1], head, seqs[0], (seqs[1:] or [None])[0]))
        # each group's first message is a candidate: nothing after the last of them
        # can be among the oldest ``limit`` when there are ``limit`` of them
        bound = max(p[2] for p in present) if len(present) == limit else _END
        head_of: dict[int, int] = {}
        for group, head, first, second in present:
            head_of[first] = head
            if second is not None and second <= bound:  # more of this group may come
                more = db.execute(_GROUP_SEQS, (queue, group, now, bound, limit)).fetchall()
                head_of.update((seq, head) for (seq,) in more)
        chosen = sorted(head_of)[:limit]
        missing = [seq for seq in chosen if seq not in rows]
        if missing:
            for row in db.execute(
                f"SELECT {_COLUMNS} FROM messages WHERE seq IN ({_marks(len(missing))})", missing
            ):
                rows[row[0]] = (*row, head_of[row[0]])
        return [rows[seq] for seq in chosen]

    # -- delete and visibility ----------------------------------------------
    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts, list(receipts))
        result = BatchResult()
        now = time.time()
        deleted: dict[str, list[int]] = {}
        with self._tx(f"deleting from queue {queue}") as db:
            self._queue(db, queue)
            for receipt in receipts:
                key = _parse_receipt(receipt)
                row = None
                if key is not None:
                    # one row per statement: SQLite deletes a list of rowids far slower
                    row = db.execute(
                        "DELETE FROM messages WHERE seq = ? AND token = ? AND queue = ?"
                        " AND visible_at > ? RETURNING group_id",
                        (key[0], key[1], queue, now),
                    ).fetchone()
                if row is None or key is None:
                    result.failed[receipt] = _STALE
                else:
                    deleted.setdefault(row[0], []).append(key[0])
            unblocked = self._refresh_groups(db, queue, deleted, now)
            version = None
            if deleted:
                count = len(receipts) - len(result.failed)
                version = self._bump(db, queue, count, wake=unblocked)
        if version is not None and unblocked:
            self._waiters.wrote({queue: version})
        return result

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        check_batch(changes, [r for r, _ in changes])
        result = BatchResult()
        now = time.time()
        groups: dict[str, None] = {}
        released: set[str] = set()
        earlier = False  # some message becomes visible earlier than it would have
        with self._tx(f"changing visibility in queue {queue}") as db:
            self._queue(db, queue)
            for receipt, seconds in changes:
                key = _parse_receipt(receipt)
                if not 0 <= seconds <= MAX_VISIBILITY_SECONDS:
                    result.failed[receipt] = f"visibility {seconds} is outside 0..43200 seconds"
                    continue
                if key is None:
                    result.failed[receipt] = _STALE
                    continue
                row = db.execute(
                    "SELECT received_at, group_id, visible_at FROM messages"
                    " WHERE seq = ? AND token = ? AND queue = ? AND visible_at > ?",
                    (key[0], key[1], queue, now),
                ).fetchone()
                if row is None:
                    result.failed[receipt] = _STALE
                elif now + seconds > row[0] + MAX_VISIBILITY_SECONDS:
                    result.failed[receipt] = "visibility would exceed 12 hours after the receive"
                else:
                    db.execute(
                        "UPDATE messages SET visible_at = ? WHERE seq = ?", (now + seconds, key[0])
                    )
                    groups[row[1]] = None
                    earlier = earlier or now + seconds < row[2]
                    if seconds == 0:
                        released.add(row[1])
            self._refresh_groups(db, queue, {group: [] for group in groups}, now, released)
            version = self._bump(db, queue, wake=earlier) if earlier else None
        if version is not None:
            self._waiters.wrote({queue: version})
        return result

    def _refresh_groups(
        self,
        db: sqlite3.Connection,
        queue: str,
        deleted: dict[str, list[int]],
        now: float,
        released: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> bool:
        """Bring the rows of these groups up to date after deletes (``deleted`` maps
        each group to the messages deleted from it) or visibility changes (with no
        messages). True if one of them is receivable now.

        ``released``: groups a message of which was made visible at once (only the
        test-only reopen mode uses it).
        """
        if not deleted:
            return False
        sql = _group_state(len(deleted))
        args = [
            v
            for n, (group, seqs) in enumerate(deleted.items())
            for v in (group, min(seqs) if seqs else None, n)
        ]
        rows = db.execute(sql, (*args, queue, queue, queue)).fetchall()
        updates: list[tuple[int, float, bool, str, int]] = []
        emptied: list[tuple[str, int]] = []
        receivable = False
        for group, head, old_head, latest in rows:
            if head is None:
                emptied.append((queue, old_head))
                continue
            blocked_until = latest or 0.0
            reopened = self.reopen_groups and group in released and blocked_until > now
            receivable = receivable or blocked_until <= now or reopened
            updates.append((head, blocked_until, reopened, queue, old_head))
        db.executemany("DELETE FROM groups WHERE queue = ? AND head_seq = ?", emptied)
        db.executemany(
            "UPDATE groups SET head_seq = ?, blocked_until = ?, reopened = reopened OR ?"
            " WHERE queue = ? AND head_seq = ?",
            updates,
        )
        return receivable

    # -- waiting ------------------------------------------------------------
    def _bump(
        self, db: sqlite3.Connection, queue: str, deleted: int = 0, *, wake: bool = True
    ) -> int:
        """Count deletes; if ``wake``, record a change of ``queue`` for waiters here and in
        other processes (they are woken after the commit). The queue's version."""
        row = db.execute(
            "UPDATE queues SET version = version + ?, deleted = deleted + ? WHERE name = ?"
            " RETURNING version",
            (int(wake), deleted, queue),
        ).fetchone()
        if row is None:  # deleted by another process since this one looked it up
            self._queue_cache.pop(queue, None)
            raise QueueNotFoundError(f"queue {queue} was deleted from {self.path}")
        return int(row[0])

    def watch(self, queues: Sequence[str], timeout: float) -> list[str] | None:
        names = list(dict.fromkeys(queues))
        deadline = time.monotonic() + max(0.0, timeout)
        waiter = self._waiters.add(names)
        try:
            self._start_watcher()
            while True:
                waiter.event.clear()
                if waiter.woken:
                    return []
                ready, next_at = self._ready(names)
                changed = self._waiters.take_changed(waiter)
                if waiter.woken:
                    return []
                if ready or changed:
                    found = ready | changed
                    return [q for q in names if q in found]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if next_at is not None:
                    remaining = min(remaining, max(0.0, next_at - time.time()) + 0.001)
                waiter.event.wait(remaining)
        finally:
            self._waiters.remove(waiter)

    def _ready(self, queues: list[str]) -> tuple[set[str], float | None]:
        """Queues where a receive could return a message now; else when one could."""
        ready: set[str] = set()
        next_at: float | None = None
        for start in range(0, len(queues), _WATCH_CHUNK):
            args = {"qs": json.dumps(queues[start : start + _WATCH_CHUNK]), "now": time.time()}
            with self._read("watching queues") as db:
                ready.update(row[0] for row in db.execute(_READY, args))
                if not ready:
                    at = db.execute(_NEXT_READY, args).fetchone()[0]
                    if at is not None and (next_at is None or at < next_at):
                        next_at = at
        return ready, next_at

    def wake_waiters(self) -> None:
        self._waiters.wake_all()

    def _start_watcher(self) -> None:
        if self.path == ":memory:" or self._closed:
            return
        if self._watcher and self._watcher.is_alive():
            return
        with self._lock:
            if self._watcher is None or not self._watcher.is_alive():
                try:
                    self._watcher = OtherProcesses(self.path, self._waiters, self._poll_interval)
                except sqlite3.Error as exc:
                    raise error(self.path, exc, "watching it for other processes") from exc
                self._watcher.start()

    # -- housekeeping -------------------------------------------------------
    def maintain(self) -> None:
        """Drop expired deduplication ids, give free pages back, truncate the WAL.

        Works in short transactions so other calls are not held up for long.
        """
        while True:
            with self._tx("dropping expired deduplication ids") as db:
                if not self._dedup.purge(db, limit=1):
                    break
        if self.path == ":memory:":
            return
        while True:
            with self._tx("giving free pages back to the disk") as db:
                incremental = db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
                if not incremental or not db.execute("PRAGMA freelist_count").fetchone()[0]:
                    break
                db.execute(f"PRAGMA incremental_vacuum({VACUUM_CHUNK})").fetchall()
        try:
            checkpoint(self.path)
        except sqlite3.Error as exc:
            raise error(self.path, exc, "checkpointing its WAL") from exc

    def close(self) -> None:
        self._waiters.wake_all(closing=True)
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()


class MemoryBroker(SqliteBroker):
    """The embedded broker's engine on an in-memory database: same FIFO semantics, no
    file, nothing shared between processes. Meant for unit tests."""

    kind = "memory"

    def __init__(self, *, reopen_groups: bool = False, stale_visibility: bool = False) -> None:
        super().__init__(":memory:", reopen_groups=reopen_groups, stale_visibility=stale_visibility)


def _parse_receipt(receipt: str) -> tuple[int, str] | None:
    seq, _, token = receipt.partition(".")
    if not seq.isdigit() or not token:
        return None
    return int(seq), token
