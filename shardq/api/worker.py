"""Worker classes: class attributes plus one method, ``perform(entity_id, payloads)``.
Defining one does no I/O; invalid attributes raise ``WorkerDefinitionError`` at once.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from types import FunctionType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from shardq.core.errors import PermanentError, UnknownWorkerError, WorkerDefinitionError
from shardq.core.jobs import (
    SETTING_CHECKS,
    Job,
    JobInfo,
    JobSpec,
    WorkerSettings,
    default_queue_name,
)
from shardq.core.limits import MAX_VISIBILITY_SECONDS

if TYPE_CHECKING:
    from shardq.publish import Publisher, PublishReport


class Registry(Protocol):
    """What a worker class uses of the app it is registered with (a :class:`shardq.App`)."""

    @property
    def publisher(self) -> Publisher: ...
    def register(self, cls: Any) -> Any: ...


class Worker:
    """Base class of worker classes: subclass it, set the class attributes (README,
    "Worker options"; validated at class definition) and write ``perform``. A worker
    instance belongs to one node thread.
    """

    shards: ClassVar[int] = 1
    priority: ClassVar[int] = 1
    batch_size: ClassVar[int] = 1
    max_retries: ClassVar[int] = 5
    visibility_timeout: ClassVar[int] = 60
    time_limit: ClassVar[float | None] = None
    queue_name: ClassVar[str | None] = None
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = (PermanentError,)

    app: ClassVar[Registry | None] = None

    #: Inside ``perform``: the 1-based attempt of the call's first job.
    attempt: int = 0
    #: Inside ``perform``: one :class:`JobInfo` per payload of the call, in order.
    jobs: Sequence[JobInfo] = ()

    def __init_subclass__(
        cls, app: Registry | None = None, abstract: bool = False, **kw: Any
    ) -> None:
        super().__init_subclass__(**kw)
        cls.app = None
        if abstract:
            return
        if cls.perform is Worker.perform:
            raise WorkerDefinitionError(f"{cls.__name__} must define perform(entity_id, payloads)")
        method = isinstance(inspect.getattr_static(cls, "perform"), FunctionType)
        try:  # called as worker.perform(entity_id, payloads)
            inspect.signature(cls.perform).bind(*((None,) if method else ()), "", [])
        except TypeError:
            raise WorkerDefinitionError(
                f"{cls.__name__}.perform must be a method perform(self, entity_id, payloads) "
                "taking the two by position"
            ) from None
        if inspect.isgeneratorfunction(cls.perform) or inspect.isasyncgenfunction(cls.perform):
            raise WorkerDefinitionError(
                f"{cls.__name__}.perform yields: calling it would run none of its body; "
                "remove the yield (return nothing, or await in an async def perform)"
            )
        for hook in ("retries_exhausted", "retry_in"):
            if inspect.iscoroutinefunction(getattr(cls, hook)):
                raise WorkerDefinitionError(
                    f"{cls.__name__}.{hook} must be a plain def: it is called without "
                    "awaiting, so an async def one would never run"
                )
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
        return WorkerSettings(cls.__name__, **values).checked(cls.__name__, WorkerDefinitionError)

    def perform(self, entity_id: str, payloads: list[Any]) -> Awaitable[None] | None:
        """Process the payloads of one entity, oldest first. Raise to fail them.
        May be ``async def``: it then runs on the node's event loop (:mod:`shardq.run.aio`)."""
        raise NotImplementedError

    def retries_exhausted(self, entity_id: str, payloads: list[Any], error: BaseException) -> None:
        """Called after jobs were moved to the morgue (retries used up or a permanent
        error). Override to alert or compensate; an exception here is logged and ignored."""

    def retry_in(self, attempt: int) -> float:
        """Seconds before retrying after failed attempt ``attempt`` (1 = first run): by
        default 2**attempt seconds with jitter (50-100 %), at most 12 h."""
        base = min(float(MAX_VISIBILITY_SECONDS), 2.0 ** min(attempt, 20))
        return base * random.uniform(0.5, 1.0)

    @classmethod
    def bound_app(cls) -> Registry:
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
        """Publish one job for ``entity_id``; returns its message id. ``dedup_id`` makes
        the publish idempotent for 5 minutes (per entity)."""
        return cls.bound_app().publisher.publish(cls, Job(entity_id, payload, dedup_id, meta))

    @classmethod
    def publish_many(cls, items: Iterable[JobSpec]) -> PublishReport:
        """Publish many jobs in batches of 10 (see :class:`shardq.publish.Publisher`)."""
        return cls.bound_app().publisher.publish_many(cls, items)
