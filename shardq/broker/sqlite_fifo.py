"""The FIFO semantics of the embedded broker, as statements on its tables, each
function inside the caller's transaction (the group rows and the test-only modes
``reopen_groups`` and ``stale_visibility``: docs/design/broker.md)."""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from shardq.broker.base import BatchResult, Message, SendEntry
from shardq.core.limits import MAX_VISIBILITY_SECONDS

# The oldest receivable messages: the first ``?3`` unblocked groups in head order hold
# them all, none after the last of those heads (unless a group was reopened, test-only);
# from each, its first ``?3`` visible messages.
_RECEIVABLE = """
WITH g AS (SELECT group_id, head_seq, reopened FROM groups
           WHERE queue = ?1 AND (blocked_until <= ?2 OR reopened) ORDER BY head_seq LIMIT ?3),
b AS (SELECT CASE WHEN COUNT(*) = ?3 AND NOT MAX(reopened) THEN MAX(head_seq)
           ELSE 9223372036854775807 END AS seq FROM g)
SELECT m.seq, m.group_id, m.body, m.message_id, m.sent_at, m.receive_count
FROM g, b JOIN messages AS m ON m.seq IN (
    SELECT seq FROM messages WHERE queue = ?1 AND group_id = g.group_id
    AND seq <= b.seq AND (NOT g.reopened OR +visible_at <= ?2)
    ORDER BY seq LIMIT ?3)
ORDER BY m.seq LIMIT ?3
"""
# For the groups of ``?2`` (a JSON list): drop those left empty, then update the others
# (only messages up to a group's last received one can be in flight).
_OF_GROUPS = "queue = ?1 AND group_id IN (SELECT value FROM json_each(?2))"
_MINE = "messages.queue = ?1 AND messages.group_id = groups.group_id"
_DROP_EMPTY = (
    f"DELETE FROM groups WHERE {_OF_GROUPS} AND NOT EXISTS (SELECT 1 FROM messages WHERE {_MINE})"
)
_REFRESH = f"""
UPDATE groups SET head_seq = (SELECT MIN(seq) FROM messages WHERE {_MINE}),
    blocked_until = COALESCE((SELECT MAX(visible_at) FROM messages
        WHERE {_MINE} AND seq <= groups.last_received), 0)
WHERE {_OF_GROUPS} RETURNING blocked_until <= ?3 OR reopened
"""
_READY = """
SELECT j.value FROM json_each(?1) AS j WHERE EXISTS (SELECT 1 FROM groups AS g
    WHERE g.queue = j.value AND (g.blocked_until <= ?2 OR g.reopened))
"""
_NEXT_READY = """
SELECT MIN(g.blocked_until) FROM json_each(?1) AS j JOIN groups AS g ON g.queue = j.value
WHERE g.blocked_until > ?2
"""
_IN_FLIGHT = "WHERE seq = ? AND token = ? AND queue = ? AND visible_at > ?"
_DELETE = f"DELETE FROM messages {_IN_FLIGHT} RETURNING group_id"
_RECEIVED = f"SELECT received_at, group_id, visible_at FROM messages {_IN_FLIGHT}"
_STALE = "receipt handle is invalid or expired (the message is visible again or was deleted)"


def store(db: sqlite3.Connection, queue: str, new: list[tuple[SendEntry, str]], now: float) -> None:
    """Store the messages ``new`` (each entry with its message id) in order, and a row for
    each group that had none."""
    rows = db.execute(
        "INSERT INTO messages (queue, group_id, body, message_id, sent_at, visible_at)"
        f" VALUES {','.join(['(?, ?, ?, ?, ?, ?)'] * len(new))} RETURNING seq, group_id",
        [v for e, mid in new for v in (queue, e.group_id, e.body, mid, now, now)],
    ).fetchall()
    db.executemany(  # in send order: a group's first message is its head
        "INSERT OR IGNORE INTO groups (queue, head_seq, group_id, blocked_until)"
        " VALUES (?, ?, ?, ?)",
        [(queue, seq, group, now) for seq, group in sorted(rows)],
    )


def take(
    db: sqlite3.Connection,
    queue: str,
    now: float,
    max_messages: int,
    visibility_timeout: float,
    stale_visibility: bool = False,
) -> tuple[list[Message], float | None]:
    """Receive up to ``max_messages`` of ``queue`` and hide them ``visibility_timeout``
    seconds; if there are none, when one may become receivable (None: not known)."""
    rows = db.execute(_RECEIVABLE, (queue, now, max_messages)).fetchall()
    hint = None
    if rows and stale_visibility:
        rows, hint = _stale_hidden(db, queue, now, rows)
    if not rows:
        return [], hint or db.execute(_NEXT_READY, (json.dumps([queue]), now)).fetchone()[0]
    token, visible_at = secrets.token_hex(8), now + visibility_timeout
    seqs = [row[0] for row in rows]
    db.execute(
        "UPDATE messages SET visible_at = ?, received_at = ?, token = ?,"
        f" receive_count = receive_count + 1 WHERE seq IN ({','.join('?' * len(seqs))})",
        (visible_at, now, token, *seqs),
    )
    last = {group: seq for seq, group, *_ in rows}  # rows are in seq order
    db.executemany(
        "UPDATE groups SET blocked_until = max(blocked_until, ?), reopened = 0,"
        " last_received = max(last_received, ?) WHERE queue = ? AND group_id = ?",
        [(visible_at, seq, queue, group) for group, seq in last.items()],
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
        for seq, group_id, body, message_id, sent_at, count in rows
    ], None


def _stale_hidden(
    db: sqlite3.Connection, queue: str, now: float, rows: list[Any]
) -> tuple[list[Any], float | None]:
    """Test-only: ``rows`` less those an older in-flight message keeps hidden (and their
    groups' later ones); with when the oldest in-flight message becomes visible."""
    oldest, until = db.execute(
        "SELECT MIN(seq), MIN(visible_at) FROM messages"
        " WHERE queue = ? AND visible_at > ? AND receive_count > 0",
        (queue, now),
    ).fetchone()
    if oldest is None:
        return rows, None
    kept, stuck = [], set()
    for row in rows:  # seq, group_id, body, message_id, sent_at, receive_count
        if row[1] in stuck or (row[5] > 0 and row[0] > oldest):
            stuck.add(row[1])
        else:
            kept.append(row)
    return kept, until


def _refresh(db: sqlite3.Connection, queue: str, groups: Iterable[str], now: float) -> bool:
    """Bring these groups' rows up to date; whether one of them is receivable now."""
    names = json.dumps(list(groups))
    db.execute(_DROP_EMPTY, (queue, names))
    return any(row[0] for row in db.execute(_REFRESH, (queue, names, now)).fetchall())


def _in_flight(
    db: sqlite3.Connection, sql: str, receipt: str, queue: str, now: float
) -> tuple[int, Any] | None:
    """The seq of the message in flight under ``receipt`` and the row ``sql`` returns for
    it, or None."""
    seq, _, token = receipt.partition(".")
    if not seq.isdigit() or not token:
        return None
    row = db.execute(sql, (int(seq), token, queue, now)).fetchone()
    return None if row is None else (int(seq), row)


def delete(
    db: sqlite3.Connection, queue: str, receipts: Sequence[str], now: float, result: BatchResult
) -> bool:
    """Delete the messages of ``receipts`` still in flight under them (the others fail in
    ``result``) and count them; whether one of their groups is receivable now."""
    groups: dict[str, None] = {}
    for receipt in receipts:
        # one row per statement: SQLite deletes a list of rowids far slower
        if found := _in_flight(db, _DELETE, receipt, queue, now):
            groups[found[1][0]] = None
        else:
            result.failed[receipt] = _STALE
    if groups:
        db.execute(
            "UPDATE queues SET deleted = deleted + ? WHERE name = ?",
            (len(receipts) - len(result.failed), queue),
        )
    return _refresh(db, queue, groups, now)


def change_visibility(
    db: sqlite3.Connection,
    queue: str,
    changes: Sequence[tuple[str, float]],
    now: float,
    result: BatchResult,
    *,
    reopen_groups: bool = False,
) -> bool:
    """Make the messages of the receipts visible that many seconds from ``now`` (refused
    changes fail in ``result``); whether one becomes visible earlier than it would have."""
    groups: dict[str, None] = {}
    released: set[str] = set()
    earlier = False
    for receipt, seconds in changes:
        found = _in_flight(db, _RECEIVED, receipt, queue, now)
        if not 0 <= seconds <= MAX_VISIBILITY_SECONDS:
            result.failed[receipt] = f"visibility {seconds} is outside 0..43200 seconds"
        elif not found:
            result.failed[receipt] = _STALE
        elif now + seconds > found[1][0] + MAX_VISIBILITY_SECONDS:
            result.failed[receipt] = "visibility would exceed 12 hours after the receive"
        else:
            seq, row = found
            db.execute("UPDATE messages SET visible_at = ? WHERE seq = ?", (now + seconds, seq))
            groups[row[1]] = None
            earlier = earlier or now + seconds < row[2]
            if seconds == 0:
                released.add(row[1])
    _refresh(db, queue, groups, now)
    if reopen_groups:  # test-only: a released group with a message still in flight
        db.executemany(
            "UPDATE groups SET reopened = 1 WHERE queue = ? AND group_id = ? AND blocked_until > ?",
            [(queue, group, now) for group in released],
        )
    return earlier


def ready(db: sqlite3.Connection, queues: str, now: float) -> tuple[list[str], float | None]:
    """Of ``queues`` (a JSON list), those where a receive could return a message now; if
    none, when a blocked group of theirs becomes receivable (None: none is blocked)."""
    found = [row[0] for row in db.execute(_READY, (queues, now))]
    return found, None if found else db.execute(_NEXT_READY, (queues, now)).fetchone()[0]
