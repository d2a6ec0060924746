"""Workers of the side-by-side benchmarks (``lane_latency``, ``embedded_ratio``,
``shutdown_times``), importable by any checkout of shardq.

Each side runs in its own process with ``PYTHONPATH=<checkout>:<this directory>``, so
``import shardq`` picks that checkout while this module stays the same for both. It
uses only the public surface both sides share: ``shardq.App``, ``shardq.Worker`` with
the class attributes ``shards``, ``max_retries``, ``batch_size`` and the method
``retry_in``; the benchmark configures each app with ``app.configure(shardq.Config(...))``
(shards through ``Config.workers``), and ``shardq run --app lane_worker:ledger_app``
imports it the same way.

* ``Blank`` (in ``blank_app``): ``perform`` does nothing but count the jobs and note the
  time of the last one (:data:`PROGRESS`).
* ``Sleep`` and ``SleepAsync`` (in ``io_app``, ``io_async_app``, for ``io_bound``):
  I/O-bound jobs that wait ``$LANE_SLEEP_MS`` per payload, with ``time.sleep`` or
  ``await asyncio.sleep`` (:data:`PEAK` counts the calls running at once).
* ``Ledger`` (in ``ledger_app``): each payload is ``{"seq": n}`` (n = the job's number
  within its entity, in publish order). An attempt fails when
  ``crc32("entity:seq:try") % 100 < LANE_FAIL_PERCENT`` (try counted in this process,
  so the same jobs fail on every run and side); a failed job is retried after 1 s
  (``retry_in``) and never reaches the morgue (``max_retries`` 1,000). Each success is
  appended to ``$LANE_LEDGER.<pid>`` as ``entity seq unix-time`` (one ``os.write`` per
  line on an ``O_APPEND`` file, so it survives a kill).
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from typing import Any

import shardq

blank_app = shardq.App()
ledger_app = shardq.App()


class Progress:
    """Jobs done in this process and when the last one finished (``perf_counter``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.last = 0.0

    def add(self, n: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.count += n
            self.last = now


PROGRESS = Progress()


class JobFailed(Exception):
    """The injected failure of an attempt (the job is retried)."""


@blank_app.register
class Blank(shardq.Worker):
    shards = 4

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        PROGRESS.add(len(payloads))


class _Ledger:
    """Per-process attempt counts and the ledger file of successes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tries: dict[tuple[str, int], int] = {}
        self.fd: int | None = None

    def attempt(self, entity: str, seq: int) -> int:
        with self.lock:
            n = self.tries[(entity, seq)] = self.tries.get((entity, seq), 0) + 1
            return n

    def record(self, entity: str, seqs: list[int]) -> None:
        now = time.time()
        data = "".join(f"{entity} {seq} {now:.6f}\n" for seq in seqs).encode()
        with self.lock:
            if self.fd is None:
                path = f"{os.environ['LANE_LEDGER']}.{os.getpid()}"
                self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self.fd, data)


_LEDGER = _Ledger()


def fails(entity: str, seq: int, attempt: int, percent: int) -> bool:
    """Whether this attempt of this job fails (deterministic, about ``percent`` %)."""
    return zlib.crc32(f"{entity}:{seq}:{attempt}".encode()) % 100 < percent


@ledger_app.register
class Ledger(shardq.Worker):
    shards = 4
    max_retries = 1000

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        percent = int(os.environ.get("LANE_FAIL_PERCENT", "0"))
        seqs = [int(p["seq"]) for p in payloads]
        for seq in seqs:
            if fails(entity_id, seq, _LEDGER.attempt(entity_id, seq), percent):
                raise JobFailed(f"{entity_id}#{seq}: injected failure")
        _LEDGER.record(entity_id, seqs)
        PROGRESS.add(len(seqs))

    def retry_in(self, attempt: int) -> float:
        return 1.0


io_app = shardq.App()
io_async_app = shardq.App()


class Peak:
    """Most ``perform`` calls running at once in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


PEAK = Peak()


def _sleep_seconds() -> float:
    return int(os.environ.get("LANE_SLEEP_MS", "50")) / 1000


@io_app.register
class Sleep(shardq.Worker):
    """An I/O-bound job: waits ``$LANE_SLEEP_MS`` (blocking, as a sync HTTP call does)."""

    shards = 8

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        PEAK.enter()
        try:
            time.sleep(_sleep_seconds() * len(payloads))
        finally:
            PEAK.leave()
        PROGRESS.add(len(payloads))


@io_async_app.register
class SleepAsync(shardq.Worker):
    """The same job written ``async def`` (awaits ``asyncio.sleep``)."""

    shards = 8

    async def perform(self, entity_id: str, payloads: list[Any]) -> None:
        import asyncio

        PEAK.enter()
        try:
            await asyncio.sleep(_sleep_seconds() * len(payloads))
        finally:
            PEAK.leave()
        PROGRESS.add(len(payloads))
