"""Jobs and worker settings as plain values, and the checks of every setting (so a config
file, an environment variable and a class attribute are refused with the same words).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, replace
from typing import Any, ClassVar, Protocol

from shardq.core.errors import ConfigError
from shardq.core.limits import (
    FIFO_SUFFIX,
    MAX_BATCH_ENTRIES,
    MAX_QUEUE_NAME_LENGTH,
    MAX_VISIBILITY_SECONDS,
    QUEUE_NAME_PATTERN,
)

MAX_SHARDS = 1000
#: ``-{shard}`` or ``-morgue`` plus ``.fifo`` follow the queue name.
MAX_BASE_NAME_LENGTH = MAX_QUEUE_NAME_LENGTH - len("-morgue") - len(FIFO_SUFFIX)


#: A setting's check: None if a value is valid, else what is wrong with it.
Check = Callable[[Any], str | None]


def int_in(low: int, high: int) -> Check:
    """The check of an int (not a bool) from ``low`` to ``high``: of every integer
    setting, and of a layout's shard counts."""

    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"expected an integer from {low} to {high}, got {value!r}"
        return None

    return check


def _time_limit(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected seconds (a number) or null, got {value!r}"
    if not 0 < value <= MAX_VISIBILITY_SECONDS:
        return f"expected seconds from 0 (exclusive) to {MAX_VISIBILITY_SECONDS}, got {value!r}"
    return None


def _queue_name(value: Any) -> str | None:
    if not isinstance(value, str) or not QUEUE_NAME_PATTERN.fullmatch(value):
        return f"expected letters, digits, '-' and '_', got {value!r}"
    if len(value) > MAX_BASE_NAME_LENGTH:
        return f"expected at most {MAX_BASE_NAME_LENGTH} characters, got {len(value)}"
    return None


#: The settings a worker class declares and a config file may override.
SETTING_CHECKS: dict[str, Check] = {
    "shards": int_in(1, MAX_SHARDS),
    "priority": int_in(1, 1000),
    "batch_size": int_in(1, MAX_BATCH_ENTRIES),
    "max_retries": int_in(0, 10_000),
    "visibility_timeout": int_in(1, MAX_VISIBILITY_SECONDS),
    "time_limit": _time_limit,
    "queue_name": _queue_name,
}


@dataclass(frozen=True)
class JobInfo:
    """One job of the running ``perform`` call (``Worker.jobs``)."""

    message_id: str
    #: 1-based attempt of this job (receives of its message, less releases by this node).
    attempt: int
    #: When it was published (seconds since the epoch, the broker's clock).
    sent_at: float
    #: The ``meta`` it was published with.
    meta: dict[str, Any]


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's effective settings: class attributes with config overrides applied."""

    name: str
    queue_name: str
    shards: int
    priority: int
    batch_size: int
    max_retries: int
    visibility_timeout: int
    time_limit: float | None

    def with_overrides(self, overrides: Mapping[str, Any], source: str) -> WorkerSettings:
        """Apply config overrides; raises :class:`ConfigError` naming key and source."""
        for key in overrides:
            if key not in SETTING_CHECKS:
                raise ConfigError(
                    f"{source}: workers.{self.name}.{key} is not a worker setting; "
                    f"use one of {', '.join(sorted(SETTING_CHECKS))}"
                )
        where = f"{source}: workers.{self.name}"
        return replace(self, **dict(overrides)).checked(where, ConfigError, overrides)

    def checked(
        self, where: str, error: type[Exception], keys: Iterable[str] = SETTING_CHECKS
    ) -> WorkerSettings:
        """These settings, after raising ``error`` (its message starting ``where``) for the
        first invalid one of ``keys``, or for a time limit not below the visibility."""
        for key in keys:
            if problem := SETTING_CHECKS[key](getattr(self, key)):
                raise error(f"{where}.{key}: {problem}")
        limit, visibility = self.time_limit, self.visibility_timeout
        if limit is not None and limit >= visibility:
            raise error(
                f"{where}: time_limit ({limit:g} s) must be below visibility_timeout "
                f"({visibility} s): a job that may run that long must be hidden longer than "
                "it runs; raise visibility_timeout or lower time_limit"
            )
        return self


@dataclass(frozen=True)
class Job:
    """One job to publish. ``dedup_id`` makes it idempotent for 5 minutes per entity."""

    entity_id: str
    payload: Any
    dedup_id: str | None = None
    meta: Mapping[str, Any] | None = None
    #: ``(call, index)``: the item of a ``publish_many`` call this job is (or is a copy of,
    #: by :meth:`with_meta` or ``dataclasses.replace``), so a report names the caller's item.
    #: Not a field (``fields``, ``asdict`` and ``astuple`` leave it out): an init-only
    #: value kept on the job, which ``replace`` passes on to the copy.
    _item: InitVar[tuple[int, int] | None] = field(default=None, kw_only=True)

    def __post_init__(self, _item: tuple[int, int] | None) -> None:
        object.__setattr__(self, "_item", _item)

    def with_meta(self, **meta: Any) -> Job:
        """A copy with these metadata keys added (for publish middleware)."""
        return replace(self, meta={**(self.meta or {}), **meta})


JobSpec = Job | tuple[str, Any] | tuple[str, Any, str | None]


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def default_queue_name(class_name: str) -> str:
    """``SyncOrder`` -> ``sync-order``; ``HTTPPing`` -> ``http-ping``."""
    return _CAMEL.sub("-", class_name).lower().replace("_", "-")


class WorkerLike(Protocol):
    """What running and publishing use of a worker class (:class:`shardq.Worker`)."""

    permanent_errors: ClassVar[tuple[type[BaseException], ...]]
    attempt: int
    jobs: Sequence[JobInfo]

    def perform(self, entity_id: str, payloads: list[Any]) -> Awaitable[None] | None: ...

    def retries_exhausted(
        self, entity_id: str, payloads: list[Any], error: BaseException
    ) -> None: ...

    def retry_in(self, attempt: int) -> float: ...
