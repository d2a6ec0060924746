"""The embedded broker's file: schema (``groups``: docs/design/broker.md; dedup tables:
:mod:`shardq.broker.sqlite_dedup`; ``shardq_state``: :mod:`shardq.store.sqlite`), opening
checks, the connection and its transactions, error messages, housekeeping."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress

from shardq.broker.sqlite_dedup import DedupIds, is_bucket_table
from shardq.core.errors import BrokerError
from shardq.core.limits import QUEUE_NAME_PATTERN

#: shardq's tables and the columns each must have (a same-named table of another
#: application is refused). ``dedup`` is only in files of earlier versions, and only
#: they write ``queues.version``.
SHARDQ_TABLES = {
    "queues": {"name", "visibility_timeout", "max_message_bytes", "version"},
    "messages": {"seq", "queue", "group_id", "body", "visible_at", "token"},
    "groups": {"queue", "group_id", "head_seq", "blocked_until", "reopened", "last_received"},
    "dedup": {"queue", "dedup_id", "message_id", "expires_at"},
    "shardq_state": {"key", "value", "version"},
}
#: The state store's table (:mod:`shardq.store.sqlite`) of the app with the default
#: queue_prefix; an app of another prefix has ``{queue_prefix}shardq_state``.
STATE_TABLE = "shardq_state"
#: The layout of this version's files, in the file's ``PRAGMA user_version`` (0 in files
#: made before it was set, and in files shared with other tables, whose it is).
FILE_FORMAT = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    visibility_timeout REAL NOT NULL,
    max_message_bytes INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0,
    salt BLOB
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    group_id TEXT NOT NULL,
    body TEXT NOT NULL,
    message_id TEXT NOT NULL,
    sent_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    received_at REAL,
    receive_count INTEGER NOT NULL DEFAULT 0,
    token TEXT
);
CREATE INDEX IF NOT EXISTS messages_by_group_seq ON messages (queue, group_id, seq);
"""

# Filled from the messages of a file made before group heads existed.
_GROUPS = """
CREATE TABLE groups (
    queue TEXT NOT NULL,
    head_seq INTEGER NOT NULL,
    group_id TEXT NOT NULL,
    blocked_until REAL NOT NULL,
    reopened INTEGER NOT NULL DEFAULT 0,
    last_received INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, head_seq)
) WITHOUT ROWID;
INSERT INTO groups (queue, head_seq, group_id, blocked_until, last_received)
    SELECT queue, MIN(seq), group_id, MAX(visible_at),
           COALESCE(MAX(CASE WHEN token IS NOT NULL THEN seq END), 0)
    FROM messages GROUP BY queue, group_id;
DROP INDEX IF EXISTS messages_by_queue;
DROP INDEX IF EXISTS messages_by_group;
DROP INDEX IF EXISTS messages_by_visibility;
"""
# A group's row by its id (files of earlier versions get it on opening).
_GROUPS_BY_ID = "CREATE UNIQUE INDEX IF NOT EXISTS groups_by_id ON groups (queue, group_id)"

#: Free pages returned to the file system per transaction by maintenance.
VACUUM_CHUNK = 128
#: After a checkpoint, the WAL file is cut back to this size at most.
WAL_SIZE_LIMIT = 4 * 2**20


class BrokerFile:
    """The broker's one connection to its file (created with shardq's schema if new),
    shared by its threads under ``lock``."""

    def __init__(self, path: str, *, allow_other_tables: bool) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.closed = False
        try:
            self._db = connect(path)
        except sqlite3.Error as exc:
            raise BrokerError(
                f"cannot open the embedded broker file {path} ({exc}); check that its "
                "directory exists and is writable"
            ) from exc
        try:
            _prepare(self._db, path, allow_other_tables)
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, sqlite3.Error):
                raise error(path, exc, "opening it") from exc
            raise

    @contextmanager
    def write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; any SQLite error rolls it back whole."""
        with self.lock, transaction(self._open(), self.path, doing) as db:
            yield db

    @contextmanager
    def read(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection for reads outside a write transaction."""
        with self.lock:
            try:
                yield self._open()
            except sqlite3.Error as exc:
                raise error(self.path, exc, doing) from exc

    def data_version(self) -> int:
        """A number that only other connections' commits to the file change."""
        with self.read("watching it for other processes") as db:
            return int(db.execute("PRAGMA data_version").fetchone()[0])

    def _open(self) -> sqlite3.Connection:
        if self.closed:
            raise BrokerError(f"the embedded broker on {self.path} is closed; make a new one")
        return self._db

    def close(self) -> None:
        with self.lock:  # closing a closed connection does nothing
            self.closed = True
            self._db.close()


def connect(path: str) -> sqlite3.Connection:
    """A connection to ``path`` for threads that share it under a lock of their own:
    explicit transactions, up to 30 s of waiting for another process's lock."""
    return sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)


def use_wal(db: sqlite3.Connection, path: str) -> None:
    """Readers never wait for a writer, a commit not for the disk; a checkpoint cuts the
    WAL back to :data:`WAL_SIZE_LIMIT` (no-op in memory)."""
    if path != ":memory:":
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")


def _prepare(db: sqlite3.Connection, path: str, allow_other_tables: bool) -> None:
    tables = _tables(db)
    states = {t for t in tables if is_state_table(t)}
    others = sorted(t for t in tables - SHARDQ_TABLES.keys() - states if not is_bucket_table(t))
    for name in tables & (SHARDQ_TABLES.keys() | states):
        columns = {row[0] for row in db.execute("SELECT name FROM pragma_table_info(?)", (name,))}
        if not SHARDQ_TABLES.get(name, SHARDQ_TABLES[STATE_TABLE]) <= columns:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            later = (
                f" (or a later shardq's: its format version is {version})" if version > 1 else ""
            )
            raise BrokerError(
                f"{path} is not a shardq broker file: its table {name!r} is another "
                f"application's{later}. Point broker_url at a file of its own (e.g. "
                "sqlite:///shardq.db)"
            )
    if tables & SHARDQ_TABLES.keys() and not allow_other_tables:  # a later version's file
        _format(db, path, others)  # (with other tables: may be shared, says so)
    if others and not allow_other_tables:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise BrokerError(
            f"{path} is not a shardq broker file: it holds other tables ({shown}). Point "
            "broker_url at a file of its own (e.g. sqlite:///shardq.db), or, to share this "
            "file on purpose, add ?allow_other_tables=1 to the URL"
        )
    if not tables:  # a new file: let maintenance give freed pages back to the disk
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    use_wal(db, path)
    with transaction(db, path, "opening it"):  # one process at a time
        tables = _tables(db)
        if not allow_other_tables and not _format(db, path):  # new, or made before it was set
            db.execute(f"PRAGMA user_version = {FILE_FORMAT}")
        _run(db, _SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(queues)")}
        if "deleted" not in columns:  # a file made by shardq 0.1.0
            db.execute("ALTER TABLE queues ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0")
        if "salt" not in columns:  # made before deduplication buckets
            db.execute("ALTER TABLE queues ADD COLUMN salt BLOB")  # made on first send
        if "groups" not in tables:  # a new file, or one made before group heads existed
            _run(db, _GROUPS)
        db.execute(_GROUPS_BY_ID)
        if "dedup" in tables:  # made before deduplication buckets
            DedupIds().migrate(db)


def _format(db: sqlite3.Connection, path: str, others: list[str] | None = None) -> int:
    """The file's format version (0: none yet); one this version does not know raises
    (``others``: the file's tables that are not shardq's)."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version not in (0, FILE_FORMAT):
        held = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "") if others else ""
        raise BrokerError(
            f"{path} is an embedded broker file of format version {version}, and this "
            f"shardq reads {FILE_FORMAT} only: "
            + (
                f"either a later shardq wrote it, or another application that shares it (it "
                f"holds {held}) set that version. If shared, add ?allow_other_tables=1 to the "
                "URL; else "
                if others
                else "a later shardq wrote it. "
            )
            + "to open it, upgrade shardq to that version, or point broker_url at another "
            "file (this one was left unchanged)"
        )
    return version


def is_state_table(name: str) -> bool:
    """Whether ``name`` is the state table of an app: ``{queue_prefix}shardq_state``."""
    prefix, ends, rest = name.rpartition(STATE_TABLE)
    return bool(ends) and not rest and (not prefix or bool(QUEUE_NAME_PATTERN.fullmatch(prefix)))


def _tables(db: sqlite3.Connection) -> set[str]:
    where = "type = 'table' AND substr(name, 1, 7) != 'sqlite_'"
    return {row[0] for row in db.execute(f"SELECT name FROM sqlite_master WHERE {where}")}


def _run(db: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


# SQLite's primary result codes (sqlite3 exposes them only from Python 3.11).
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 5, 6, 8, 10, 11, 13, 14, 26
# Before Python 3.11 an exception carries no code: recognise SQLite's messages.
_BY_TEXT = {
    "database or disk is full": _FULL,
    "file is not a database": _NOTADB,
    "malformed": _CORRUPT,
    "locked": _BUSY,
    "readonly": _READONLY,
    "disk i/o error": _IOERR,
    "unable to open": _CANTOPEN,
}
# What went wrong and what to do, by result codes.
_MEANING = {
    (_FULL,): "is full: no room on its disk or in its size limit ({exc}) while {doing}; "
    "nothing of this call was stored. Free disk space, then retry",
    (_CORRUPT, _NOTADB): "is damaged or not an SQLite database ({exc}) while {doing}; "
    "restore it from a backup or point broker_url at a new file",
    (_BUSY, _LOCKED): "stayed locked by another process for 30 s ({exc}) while {doing}; "
    "retry, and check for a process holding it",
    (_READONLY,): "is read-only ({exc}) while {doing}; make it and its directory writable",
    (_IOERR, _CANTOPEN): "could not be read or written ({exc}) while {doing}; check its "
    "disk and permissions, then retry",
}


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc).lower()
    return next((c for words, c in _BY_TEXT.items() if words in text), None)


@contextmanager
def transaction(
    db: sqlite3.Connection,
    path: str,
    doing: str,
    *,
    begin: str = "BEGIN IMMEDIATE",
    error_type: type[Exception] = BrokerError,
) -> Iterator[sqlite3.Connection]:
    """One transaction on ``db`` (of the file ``path``); any SQLite error rolls it back
    whole and is raised as ``error_type`` saying what went wrong and what to do."""
    try:
        db.execute(begin)
    except sqlite3.Error as exc:
        raise error_type(str(error(path, exc, doing))) from exc
    try:
        yield db
        db.execute("COMMIT")
    except BaseException as exc:
        # SQLite may have rolled back already (it may, e.g. when the disk is full)
        with suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise error_type(str(error(path, exc, doing))) from exc
        raise


def error(path: str, exc: sqlite3.Error, doing: str) -> BrokerError:
    """A :class:`BrokerError` saying what went wrong with the file and what to do."""
    code = _code(exc)
    meaning = next(
        (m for codes, m in _MEANING.items() if code in codes),
        "failed ({exc}) while {doing}; retry or check the file",
    )
    return BrokerError(f"the embedded broker file {path} " + meaning.format(exc=exc, doing=doing))


def give_back_pages(db: sqlite3.Connection) -> bool:
    """Return up to :data:`VACUUM_CHUNK` free pages to the file system, inside the
    caller's transaction; False if there were none (or the file cannot)."""
    incremental = db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    if not incremental or not db.execute("PRAGMA freelist_count").fetchone()[0]:
        return False
    db.execute(f"PRAGMA incremental_vacuum({VACUUM_CHUNK})").fetchall()
    return True


def checkpoint(path: str) -> None:
    """Copy the WAL into the file and truncate the WAL (skipped while others hold it: the
    next maintenance tries again)."""
    db = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    with closing(db), suppress(sqlite3.OperationalError):
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def compact(path: str) -> None:
    """Rewrite the broker file at ``path`` to its smallest size, by hand, with every node
    and publisher using it stopped (it locks the file while it rewrites it). It also
    switches a file of an earlier version to incremental vacuum, so maintenance shrinks it."""
    with closing(connect(path)) as db:
        try:
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise error(path, exc, "compacting it") from exc
