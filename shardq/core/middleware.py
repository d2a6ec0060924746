"""Middleware: code around ``perform`` and ``publish``, and node start/stop hooks (usage:
docs/operations.md, "Middleware and hooks"). The first added is outermost; one that raises
is logged and never kills a node, a job's own exception stays its failure, and a second
``call()`` (later, or on another thread meanwhile: once it is in) returns (or raises) what the
first did without running anything again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from shardq.core.jobs import Job

log = structlog.get_logger("shardq.middleware")
T = TypeVar("T")


class NodeInfo(Protocol):
    """What a node hook is given: the running :class:`~shardq.run.node.Node`."""

    @property
    def id(self) -> str: ...


@dataclass(frozen=True)
class PerformContext:
    """One ``perform`` call: the entity's consecutive jobs and their metadata."""

    worker: str
    entity_id: str
    payloads: list[Any]
    attempt: int
    message_ids: list[str]
    metas: list[dict[str, Any]]


@dataclass
class PublishContext:
    """One ``publish``/``publish_many`` call; ``jobs`` may be replaced in place."""

    worker: str
    jobs: list[Job] = field(default_factory=list)


class Middleware:
    """Base class: every method does nothing but call through."""

    def around_perform(self, call: Callable[[], None], ctx: PerformContext) -> None:
        call()

    def around_publish(self, call: Callable[[], T], ctx: PublishContext) -> T:
        return call()

    def on_node_start(self, node: NodeInfo) -> None:
        """Called once a node has its plan and queues, before it takes jobs."""

    def on_node_stop(self, node: NodeInfo) -> None:
        """Called after a node stopped taking jobs and released what it held."""


def run_around(middlewares: Sequence[Middleware], hook: str, inner: Callable[[], T], ctx: Any) -> T:
    """Run ``inner`` inside every middleware's ``hook`` (``around_perform``/``around_publish``)."""
    call = inner
    for middleware in reversed(middlewares):
        call = functools.partial(_guarded, middleware, hook, call, ctx)
    return call()


def notify(middlewares: Sequence[Middleware], hook: str, node: NodeInfo) -> None:
    """Call ``on_node_start``/``on_node_stop`` of each middleware; failures are logged."""
    for middleware in middlewares:
        try:
            getattr(middleware, hook)(node)
        except BaseException:  # a CancelledError or a library's own stop too: as around_*
            log.exception(
                "middleware.failed", middleware=type(middleware).__name__, hook=hook, node=node.id
            )


@dataclass
class _Call:
    """The inner call a middleware is given, and what happened to it."""

    inner: Callable[[], Any]
    called: bool = False
    result: Any = None
    error: BaseException | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)  # a second call waits

    def __call__(self) -> Any:
        with self.lock:  # a second call: the first's outcome, never a second run or publish
            if not self.called:
                self.called = True
                try:
                    self.result = self.inner()
                except BaseException as exc:
                    self.error = exc
        if self.error is not None:
            raise self.error
        return self.result


def _ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C, which lands in the main thread (elsewhere, or around a
    job, which must not run again for it, a KeyboardInterrupt is a middleware's failure)."""
    return (
        isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()
    )


def _guarded(middleware: Middleware, hook: str, inner: Callable[[], T], ctx: Any) -> T:
    """``inner`` run inside ``middleware``'s ``hook``, which cannot keep it from running
    nor run it twice."""
    call = _Call(inner)
    name = type(middleware).__name__
    try:
        getattr(middleware, hook)(call, ctx)  # the result is the call's, returned or not
    except BaseException as exc:
        if exc is call.error or (hook == "around_publish" and _ctrl_c(exc)):
            raise  # the job's (or publish's) own failure, or Ctrl-C in a publish, passing through
        log.exception(
            "middleware.failed",
            middleware=name,
            hook=hook,
            worker=getattr(ctx, "worker", None),
            entity=getattr(ctx, "entity_id", None),
            detail="after the call; its outcome stands"
            if call.called
            else "before the call; ran without it",
        )
    else:
        if not call.called:
            detail = "it did not call call(); running the job anyway"
            log.warning("middleware.skipped_call", middleware=name, hook=hook, detail=detail)
    # run without this middleware if it did not call, through ``call`` so that a later call
    # does not run it again; else its outcome (once in), even if the middleware swallowed it
    return call()  # type: ignore[no-any-return]
