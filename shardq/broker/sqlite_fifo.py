"""The FIFO semantics of the embedded broker, as statements on its tables.

Each function runs inside the caller's transaction (the broker in
:mod:`shardq.broker.sqlite` opens them, and wakes waiters after commits):
storing sent messages with their groups, choosing and hiding the messages a
receive returns, deleting by receipt, changing visibility, and keeping each
group's row (its head, how long it is blocked) up to date.

A receive returns the oldest receivable messages, in send order: it walks the
receivable groups in head order, then reads only the messages that can be among
the oldest. Short indexed queries, however long the backlog behind any group.

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
from collections.abc import Sequence
from typing import Any

from shardq.broker.base import BatchResult, Message, SendEntry
from shardq.core.limits import MAX_BATCH_ENTRIES, MAX_VISIBILITY_SECONDS

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


def _parse_receipt(receipt: str) -> tuple[int, str] | None:
    seq, _, token = receipt.partition(".")
    if not seq.isdigit() or not token:
        return None
    return int(seq), token


def store(db: sqlite3.Connection, queue: str, new: list[tuple[SendEntry, str]], now: float) -> None:
    """Store the messages ``new`` (each entry with its message id), in order, and a row
    for each group that had no messages."""
    groups = list(dict.fromkeys(e.group_id for e, _ in new))
    known = {row[0] for row in db.execute(_KNOWN_GROUPS, (json.dumps(groups), queue)).fetchall()}
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


def take(
    db: sqlite3.Connection,
    queue: str,
    now: float,
    max_messages: int,
    visibility_timeout: float,
    *,
    stale_visibility: bool = False,
) -> tuple[list[Message], float | None]:
    """Receive up to ``max_messages`` of ``queue`` and hide them ``visibility_timeout``
    seconds; if there are none, when one may become receivable (None: not known)."""
    visible_at = now + visibility_timeout
    rows = receivable(db, queue, now, max_messages)
    if rows and stale_visibility:
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


def receivable(db: sqlite3.Connection, queue: str, now: float, limit: int) -> list[tuple[Any, ...]]:
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


def refresh_groups(
    db: sqlite3.Connection,
    queue: str,
    deleted: dict[str, list[int]],
    now: float,
    released: set[str] = frozenset(),  # type: ignore[assignment]
    *,
    reopen_groups: bool = False,
) -> bool:
    """Bring the rows of these groups up to date after deletes (``deleted`` maps
    each group to the messages deleted from it) or visibility changes (with no
    messages). True if one of them is receivable now.

    ``released``: groups a message of which was made visible at once (only the
    test-only ``reopen_groups`` mode uses it).
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
        reopened = reopen_groups and group in released and blocked_until > now
        receivable = receivable or blocked_until <= now or reopened
        updates.append((head, blocked_until, reopened, queue, old_head))
    db.executemany("DELETE FROM groups WHERE queue = ? AND head_seq = ?", emptied)
    db.executemany(
        "UPDATE groups SET head_seq = ?, blocked_until = ?, reopened = reopened OR ?"
        " WHERE queue = ? AND head_seq = ?",
        updates,
    )
    return receivable


def delete(
    db: sqlite3.Connection,
    queue: str,
    receipts: Sequence[str],
    now: float,
    result: BatchResult,
    *,
    reopen_groups: bool = False,
) -> tuple[dict[str, list[int]], bool]:
    """Delete the messages of ``receipts`` that are still in flight under them (the
    others fail in ``result``); the messages deleted by group, and whether one of
    their groups is receivable now."""
    deleted: dict[str, list[int]] = {}
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
    unblocked = refresh_groups(db, queue, deleted, now, reopen_groups=reopen_groups)
    return deleted, unblocked


def change_visibility(
    db: sqlite3.Connection,
    queue: str,
    changes: Sequence[tuple[str, float]],
    now: float,
    result: BatchResult,
    *,
    reopen_groups: bool = False,
) -> bool:
    """Make the messages of the receipts visible that many seconds from ``now`` (the
    changes refused fail in ``result``); whether some message becomes visible earlier
    than it would have."""
    groups: dict[str, None] = {}
    released: set[str] = set()
    earlier = False
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
            db.execute("UPDATE messages SET visible_at = ? WHERE seq = ?", (now + seconds, key[0]))
            groups[row[1]] = None
            earlier = earlier or now + seconds < row[2]
            if seconds == 0:
                released.add(row[1])
    refresh_groups(
        db, queue, {group: [] for group in groups}, now, released, reopen_groups=reopen_groups
    )
    return earlier


def ready(db: sqlite3.Connection, queues: str, now: float) -> list[str]:
    """Of ``queues`` (a JSON list), those where a receive could return a message now."""
    return [row[0] for row in db.execute(_READY, {"qs": queues, "now": now})]


def next_ready(db: sqlite3.Connection, queues: str, now: float) -> float | None:
    """When a blocked group of ``queues`` (a JSON list) becomes receivable (None: none is
    blocked)."""
    at = db.execute(_NEXT_READY, {"qs": queues, "now": now}).fetchone()[0]
    return None if at is None else float(at)
