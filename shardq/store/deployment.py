"""What the layers under the API use of an app (:class:`shardq.App` is one): its config,
broker, state store and layouts, and each worker's settings and queue names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from shardq.broker.base import Broker
from shardq.core.jobs import WorkerLike
from shardq.core.middleware import Middleware
from shardq.core.plan import Plan
from shardq.store.layouts import Layouts, Registry


class Deployment(Registry, Protocol):
    @property
    def broker(self) -> Broker: ...
    @property
    def layouts(self) -> Layouts: ...
    @property
    def signing_key(self) -> bytes | None: ...
    @property
    def middleware(self) -> list[Middleware]: ...
    @property
    def workers(self) -> Mapping[str, type[WorkerLike]]: ...

    def worker(self, name: str) -> type[WorkerLike]: ...
    def shard_queue(self, worker: str, shard: int, gen: int = 0) -> str: ...
    def morgue_queue(self, worker: str) -> str: ...
    def ensure_queue(self, queue: str, worker: str) -> None: ...
    def live_shards(self, worker: str) -> dict[str, int]: ...
    def plan(self, *, node: int = 0, nodes: int = 1, threads: int | None = None) -> Plan: ...


def live_shards(app: Deployment) -> dict[str, int]:
    """Generation name -> shard count of every worker's live layout (the copy in hand)."""
    return {name: n for worker in app.workers for name, n in app.live_shards(worker).items()}
