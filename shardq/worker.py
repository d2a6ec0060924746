"""Worker classes: class attributes plus one method, ``perform(entity_id, payloads)``.

::

    app = shardq.App()

    @app.register
    class SyncOrder(shardq.Worker):
        shards = 8
        priority = 5
        batch_size = 10

        def perform(self, entity_id, payloads):
            ...

Defining or importing a worker class does no I/O. Invalid attribute values raise
:class:`~shardq.errors.WorkerDefinitionError` when the class is defined.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

from shardq.errors import ConfigError, PermanentError, UnknownWorkerError, WorkerDefinitionError
from shardq.limits import (
    FIFO_SUFFIX,
    MAX_BATCH_ENTRIES,
    MAX_QUEUE_NAME_LENGTH,
    MAX_VISIBILITY_SECONDS,
    QUEUE_NAME_PATTERN,
)

if TYPE_CHECKING:
    from shardq.app import App
    from shardq.publisher import JobSpec, PublishReport

MAX_SHARDS = 1000
MAX_PRIORITY = 1000
#: ``-{shard}`` or ``-morgue`` plus ``.fifo`` follow the queue name.
QUEUE_SUFFIX_ROOM = len("-morgue") + len(FIFO_SUFFIX)
MAX_BASE_NAME_LENGTH = MAX_QUEUE_NAME_LENGTH - QUEUE_SUFFIX_ROOM


def _int_in(low: int, high: int) -> Any:
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
SETTING_CHECKS = {
    "shards": _int_in(1, MAX_SHARDS),
    "priority": _int_in(1, MAX_PRIORITY),
    "batch_size": _int_in(1, MAX_BATCH_ENTRIES),
    "max_retries": _int_in(0, 10_000),
    "visibility_timeout": _int_in(1, MAX_VISIBILITY_SECONDS),
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
        for key, value in overrides.items():
            check = SETTING_CHECKS.get(key)
            if check is None:
                raise ConfigError(
                    f"{source}: workers.{self.name}.{key} is not a worker setting; "
                    f"use one of {', '.join(sorted(SETTING_CHECKS))}"
                )
            problem = check(value)
            if problem:
                raise ConfigError(f"{source}: workers.{self.name}.{key}: {problem}")
        settings = replace(self, **dict(overrides))
        problem = settings.problem()
        if problem:
            raise ConfigError(f"{source}: workers.{self.name}: {problem}")
        return settings

    def problem(self) -> str | None:
        """What is wrong with the settings taken together (None: nothing)."""
        limit, visibility = self.time_limit, self.visibility_timeout
        if limit is not None and limit >= visibility:
            return (
                f"time_limit ({limit:g} s) must be below visibility_timeout ({visibility} s): "
                "a job that may run that long must be hidden longer than it runs; raise "
                "visibility_timeout or lower time_limit"
            )
        return None


class Worker:
    """Base class of worker classes. Subclass it, set attributes, write ``perform``.

    Attributes (all validated at class definition):

    * ``shards`` (1..1000): FIFO queues the worker's entities are spread over: the
      initial layout (``shardq reshard`` changes a live worker's shards).
    * ``priority`` (1..1000): lottery tickets; a level with more wins more often.
    * ``batch_size`` (1..10): most consecutive jobs of one entity per ``perform`` call.
    * ``max_retries`` (>= 0): retries after the first attempt before the morgue.
    * ``visibility_timeout`` (seconds): how long a received job stays hidden before
      the heartbeat extends it; a crashed node's jobs return after this.
    * ``time_limit`` (seconds or None): a longer ``perform`` counts as a failure.
    * ``queue_name``: base of the queue names; defaults from the class name
      (``SyncOrder`` -> ``sync-order``).
    * ``permanent_errors``: exception types that skip retries and go to the morgue.

    Inside ``perform``, ``self.attempt`` is the 1-based attempt of the call's first
    job and ``self.jobs`` gives each job of the call its message id, attempt, sent
    time and ``meta``. A worker instance belongs to one node thread.
    """

    shards: ClassVar[int] = 1
    priority: ClassVar[int] = 1
    batch_size: ClassVar[int] = 1
    max_retries: ClassVar[int] = 5
    visibility_timeout: ClassVar[int] = 60
    time_limit: ClassVar[float | None] = None
    queue_name: ClassVar[str | None] = None
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = (PermanentError,)

    app: ClassVar[App | None] = None

    #: Inside ``perform``: the 1-based attempt of the call's first job.
    attempt: int = 0
    #: Inside ``perform``: one :class:`JobInfo` per payload of the call, in order.
    jobs: Sequence[JobInfo] = ()

    def __init_subclass__(cls, app: App | None = None, abstract: bool = False, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.app = None
        if abstract:
            return
        if cls.perform is Worker.perform:
            raise WorkerDefinitionError(f"{cls.__name__} must define perform(entity_id, payloads)")
        cls.default_settings()
        errors = cls.permanent_errors
        if not isinstance(errors, tuple) or not all(
            isinstance(e, type) and issubclass(e, BaseException) for e in errors
        ):
            raise WorkerDefinitionError(
                f"{cls.__name__}.permanent_errors must be a tuple of exception classes"
            )
        if app is not None:
            app.register(cls)

    @classmethod
    def default_settings(cls) -> WorkerSettings:
        """The settings the class declares, validated."""
        values = {key: getattr(cls, key) for key in SETTING_CHECKS}
        if values["queue_name"] is None:
            values["queue_name"] = default_queue_name(cls.__name__)
        for key, value in values.items():
            problem = SETTING_CHECKS[key](value)
            if problem:
                raise WorkerDefinitionError(f"{cls.__name__}.{key}: {problem}")
        settings = WorkerSettings(name=cls.__name__, **values)
        problem = settings.problem()
        if problem:
            raise WorkerDefinitionError(f"{cls.__name__}: {problem}")
        return settings

    # -- what users write ------------------------------------------------------
    def perform(self, entity_id: str, payloads: list[Any]) -> Awaitable[None] | None:
        """Process the payloads of one entity, oldest first. Raise to fail them.
        May be ``async def``: it then runs on the node's event loop (:mod:`shardq.aio`)."""
        raise NotImplementedError

    def retries_exhausted(self, entity_id: str, payloads: list[Any], error: BaseException) -> None:
        """Called after jobs were moved to the morgue (retries used up or a permanent
        error). Override to alert or compensate; an exception here is logged and ignored."""

    def retry_in(self, attempt: int) -> float:
        """Seconds before retrying after failed attempt ``attempt`` (1 = first run).

        Default: exponential, 2**attempt seconds with jitter (50-100 %), at most 12 h.
        """
        base = min(float(MAX_VISIBILITY_SECONDS), 2.0 ** min(attempt, 20))
        return base * random.uniform(0.5, 1.0)

    # -- publishing ------------------------------------------------------------
    @classmethod
    def bound_app(cls) -> App:
        if cls.app is None:
            raise UnknownWorkerError(
                f"{cls.__name__} is not registered with an App; decorate it with "
                f"@app.register or declare `class {cls.__name__}(shardq.Worker, app=app)`"
            )
        return cls.app

    @classmethod
    def publish(
        cls,
        entity_id: str,
        payload: Any,
        dedup_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> str:
        """Publish one job for ``entity_id``; returns its message id.

        ``dedup_id`` makes the publish idempotent for 5 minutes (per entity).
        """
        from shardq.publisher import Job

        report = cls.bound_app().publisher.publish_many(
            cls, [Job(entity_id, payload, dedup_id, meta)]
        )
        return cast(str, report.message_ids[0])  # publish_many raised if it was not sent

    @classmethod
    def publish_many(cls, items: Iterable[JobSpec]) -> PublishReport:
        """Publish many jobs in batches of 10 (see :class:`shardq.publisher.Publisher`)."""
        return cls.bound_app().publisher.publish_many(cls, items)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def default_queue_name(class_name: str) -> str:
    """``SyncOrder`` -> ``sync-order``; ``HTTPPing`` -> ``http-ping``."""
    return _CAMEL.sub("-", class_name).lower().replace("_", "-")


SETTING_NAMES = tuple(f.name for f in fields(WorkerSettings) if f.name != "name")
