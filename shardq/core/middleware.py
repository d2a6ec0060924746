"""Middleware: code around ``perform`` and ``publish``, and node start/stop hooks.

Subclass :class:`Middleware`, override what you need, and add it to the app::

    class Tracing(shardq.Middleware):
        def around_publish(self, call, ctx):
            ctx.jobs[:] = [j.with_meta(trace_id=current_trace_id()) for j in ctx.jobs]
            return call()

        def around_perform(self, call, ctx):
            with tracer.span(ctx.worker, trace_id=ctx.metas[0].get("trace_id")):
                call()

    app.add_middleware(Tracing())

Middleware run in the order added (the first is outermost). One that raises is logged
and never kills a node: before ``call``, the job runs without it; after, the job's
outcome stands. A job's own exception stays its failure, even if a middleware swallows
it. Middleware stay synchronous: for ``async def perform``, ``call()`` runs the whole
awaited ``perform`` on the node's event loop (:mod:`shardq.run.aio`).
"""

from __future__ import annotations

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
        call = _guarded(middleware, hook, call, ctx)
    return call()


def notify(middlewares: Sequence[Middleware], hook: str, node: NodeInfo) -> None:
    """Call ``on_node_start``/``on_node_stop`` of each middleware; failures are logged."""
    for middleware in middlewares:
        try:
            getattr(middleware, hook)(node)
        except Exception:
            log.exception(
                "middleware.failed",
                middleware=type(middleware).__name__,
                hook=hook,
                node=node.id,
            )


class _Call:
    """What happened to the inner call while a middleware ran."""

    def __init__(self, inner: Callable[[], Any]) -> None:
        self.inner = inner
        self.called = False
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> Any:
        self.called = True
        try:
            self.result = self.inner()
        except BaseException as exc:
            self.error = exc
            raise
        self.done = True
        return self.result


def _guarded(
    middleware: Middleware, hook: str, inner: Callable[[], T], ctx: Any
) -> Callable[[], T]:
    def run() -> T:
        call = _Call(inner)
        try:
            result: T = getattr(middleware, hook)(call, ctx)
        except BaseException as exc:
            if call.error is not None and exc is call.error:
                raise  # the job's (or publish's) own failure, passing through
            _log_failure(middleware, hook, ctx, called=call.called)
            if not call.called:
                return inner()  # run it without this middleware
            if call.error is not None:
                raise call.error from None
            return call.result  # type: ignore[no-any-return]
        if not call.called:
            log.warning(
                "middleware.skipped_call",
                middleware=type(middleware).__name__,
                hook=hook,
                detail="it did not call call(); running the job anyway",
            )
            return inner()
        if call.error is not None:  # swallowed by the middleware: still a failure
            raise call.error
        return result if hook != "around_perform" else call.result  # type: ignore[no-any-return]

    return run


def _log_failure(middleware: Middleware, hook: str, ctx: Any, *, called: bool) -> None:
    log.exception(
        "middleware.failed",
        middleware=type(middleware).__name__,
        hook=hook,
        worker=getattr(ctx, "worker", None),
        entity=getattr(ctx, "entity_id", None),
        detail="after the call; its outcome stands"
        if called
        else "before the call; ran without it",
    )
