"""One document kept as the only message group of a FIFO queue (the layout document).

(The fleet itself lives in the state store: :mod:`shardq.fleet`.)

* **Write** (:meth:`FleetStore.update`): receive the document with a visibility of
  ``lock_seconds``. While it is in flight no other writer can receive it (a FIFO
  group lock), so the receive is an exclusive lock. Send the changed document (one
  version higher), then delete the received one. A writer that dies between the two
  leaves both; the next reader takes the highest version and the next writer deletes
  the rest. A writer that took longer than its lock (minus a margin) gives up that
  try rather than overwrite a newer version. Three requests per write.
* **Read** (:meth:`FleetStore.read`): receive with visibility 0 (a peek: the group is
  not locked), one request. While a writer holds the lock the peek finds nothing and
  is tried again a little later.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar

import structlog

from shardq.broker.base import Broker, Message, SendEntry
from shardq.errors import BrokerError, FleetError
from shardq.limits import MAX_BATCH_ENTRIES, MAX_MESSAGE_BYTES

log = structlog.get_logger("shardq.fleet")

#: The message group holding the document.
GROUP = "fleet"
#: Dedup id of the first (empty) document: concurrent creators store one.
CREATED_DEDUP_ID = "fleet-created"
#: A write that took longer than its lock minus this does not send its version.
LOCK_MARGIN_SECONDS = 2.0


class _Doc(Protocol):
    @property
    def version(self) -> int: ...

    @property
    def written(self) -> float: ...

    def to_text(self) -> str: ...


D = TypeVar("D", bound=_Doc)


class DocStore(Generic[D]):
    """Read and write one document (a fleet's, a layout's) on a broker.

    ``load`` parses a document's text (raising ``error`` when it is not one);
    ``blank`` makes the first, empty document.
    """

    def __init__(
        self,
        broker: Broker,
        queue: str,
        *,
        load: Callable[[str], D],
        blank: Callable[[], D],
        group: str = GROUP,
        what: str = "fleet document",
        error: type[Exception] = FleetError,
        lock_seconds: float = 10.0,
    ) -> None:
        if lock_seconds <= LOCK_MARGIN_SECONDS:
            raise ValueError(f"lock_seconds must exceed {LOCK_MARGIN_SECONDS}")
        self.broker = broker
        self.queue = queue
        self.lock_seconds = lock_seconds
        self._load, self._blank, self._group = load, blank, group
        self._what, self._error = what, error
        self._rng = random.Random()

    def ensure(self) -> None:
        """Create the fleet state queue unless it exists."""
        self.broker.ensure_queue(
            self.queue,
            visibility_timeout=int(self.lock_seconds),
            max_message_bytes=MAX_MESSAGE_BYTES,
        )

    def read(self, timeout: float = 5.0) -> D | None:
        """The current document (None if there is none yet), without locking it."""
        deadline = time.monotonic() + timeout
        while True:
            messages = self._receive(visibility=0.0)
            docs = self._parse(messages, delete_bad=False)
            if docs:
                return docs[-1]
            if not messages and self._empty():
                return None
            if time.monotonic() >= deadline:
                raise self._error(self._locked_text(timeout))
            self._pause()

    def update(self, change: Callable[[D], D], timeout: float = 15.0) -> D:
        """Apply ``change`` to the current document under the lock; the written version.

        ``change`` may be called more than once (a try that lost its lock is redone);
        it must not have side effects beyond building the new document.
        """
        deadline = time.monotonic() + timeout
        while True:
            received_at = time.monotonic()
            messages = self._receive(visibility=self.lock_seconds)
            if messages:
                written = self._write(messages, change, received_at)
                if written is not None:
                    return written
            elif self._empty():
                self._create()
                continue
            if time.monotonic() >= deadline:
                raise self._error(self._locked_text(timeout))
            self._pause()

    # -- internals ------------------------------------------------------------------
    def _write(
        self, messages: list[Message], change: Callable[[D], D], received_at: float
    ) -> D | None:
        docs = self._parse(messages, delete_bad=True)
        current = docs[-1] if docs else self._blank()
        changed: Any = change(current)
        new: D = replace(changed, version=current.version + 1, written=time.time())
        text = new.to_text()
        if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
            raise self._error(
                f"the {self._what} would be {len(text)} bytes, over the {MAX_MESSAGE_BYTES}"
                " bytes a message can hold: too many nodes or shards for one fleet"
            )
        if time.monotonic() - received_at > self.lock_seconds - LOCK_MARGIN_SECONDS:
            log.warning("fleet.lock_lapsed", detail=f"writing the {self._what} took too long")
            return None  # another writer may hold a newer version by now
        entry = SendEntry("0", text, self._group, uuid.uuid4().hex)
        result = self.broker.send_batch(self.queue, [entry])
        if result.failed:
            raise BrokerError(f"sending the {self._what} failed: {result.failed['0']}")
        deleted = self.broker.delete_batch(self.queue, [m.receipt for m in messages])
        if deleted.failed:  # the next writer deletes what is left
            log.warning("fleet.old_versions_left", count=len(deleted.failed))
        return new

    def _receive(self, visibility: float) -> list[Message]:
        return self.broker.receive(
            self.queue,
            max_messages=MAX_BATCH_ENTRIES,
            wait_seconds=0,
            visibility_timeout=visibility,
        )

    def _parse(self, messages: list[Message], *, delete_bad: bool) -> list[D]:
        """The documents among ``messages``, oldest version first."""
        docs, bad = [], []
        for message in messages:
            if message.group_id != self._group:
                continue
            try:
                docs.append(self._load(message.body))
            except self._error as exc:
                if "newer than" in str(exc):
                    raise
                log.warning(
                    "fleet.bad_document",
                    what=self._what,
                    message_id=message.message_id,
                    error=str(exc),
                )
                bad.append(message.receipt)
        if bad and delete_bad and docs:
            self.broker.delete_batch(self.queue, bad)
        return sorted(docs, key=lambda d: (d.version, d.written))

    def _empty(self) -> bool:
        counts = self.broker.counts(self.queue)
        return counts.waiting == 0 and counts.in_flight == 0

    def _create(self) -> None:
        entry = SendEntry("0", self._blank().to_text(), self._group, CREATED_DEDUP_ID)
        result = self.broker.send_batch(self.queue, [entry])
        if result.failed:
            raise BrokerError(f"creating the {self._what} failed: {result.failed['0']}")

    def _pause(self) -> None:
        time.sleep(self._rng.uniform(0.02, 0.2))

    def _locked_text(self, timeout: float) -> str:
        return (
            f"the {self._what} in {self.queue} stayed locked for {timeout:.0f} s; another "
            "node may be writing it over a slow link. Try again; if it persists, check "
            "that the broker answers"
        )
