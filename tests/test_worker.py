"""Worker classes: attributes are validated when the class is defined."""

from __future__ import annotations

import random
from typing import Any

import pytest

import shardq
from shardq.core.errors import (
    ConfigError,
    PermanentError,
    UnknownWorkerError,
    WorkerDefinitionError,
)
from shardq.core.jobs import MAX_BASE_NAME_LENGTH, WorkerSettings, default_queue_name
from shardq.core.limits import MAX_VISIBILITY_SECONDS


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


def define(name: str = "Sample", **attrs: Any) -> type[shardq.Worker]:
    """Define a worker class named ``name`` with ``perform`` and the given attributes."""
    return type(name, (shardq.Worker,), {"perform": _perform, **attrs})


# -- defaults ------------------------------------------------------------------


def test_a_minimal_worker_gets_the_documented_default_settings() -> None:
    # given a worker that only defines perform
    class SyncOrder(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # when its settings are read
    settings = SyncOrder.default_settings()
    # then they are the documented defaults
    assert settings == WorkerSettings(
        name="SyncOrder",
        queue_name="sync-order",
        shards=1,
        priority=1,
        batch_size=1,
        max_retries=5,
        visibility_timeout=60,
        time_limit=None,
    )


def test_declared_attributes_become_the_default_settings() -> None:
    # given a worker declaring every setting
    worker = define(
        "Billing",
        shards=16,
        priority=7,
        batch_size=10,
        max_retries=0,
        visibility_timeout=300,
        time_limit=12.5,
        queue_name="bill_v2",
    )
    # when its settings are read
    settings = worker.default_settings()
    # then each declared value is used
    assert (settings.shards, settings.priority, settings.batch_size) == (16, 7, 10)
    assert (settings.max_retries, settings.visibility_timeout) == (0, 300)
    assert settings.time_limit == 12.5
    assert settings.queue_name == "bill_v2"


@pytest.mark.parametrize(
    ("class_name", "queue_name"),
    [
        ("SyncOrder", "sync-order"),
        ("HTTPPing", "http-ping"),
        ("Ping", "ping"),
        ("XMLHttpRequest", "xml-http-request"),
        ("S3Upload", "s3-upload"),
        ("SyncOrderV2", "sync-order-v2"),
        ("send_email", "send-email"),
        ("Send_Email", "send-email"),
    ],
)
def test_the_default_queue_name_is_the_class_name_in_kebab_case(
    class_name: str, queue_name: str
) -> None:
    # given a worker class without a queue_name
    worker = define(class_name)
    # when its settings are read
    settings = worker.default_settings()
    # then the queue name is derived from the class name
    assert settings.queue_name == queue_name
    assert default_queue_name(class_name) == queue_name


def test_an_explicit_queue_name_wins_over_the_class_name() -> None:
    # given a worker with a queue_name
    worker = define("SyncOrder", queue_name="orders")
    # then it is used as is
    assert worker.default_settings().queue_name == "orders"


# -- invalid attributes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("shards", 0),
        ("shards", 1001),
        ("shards", "4"),
        ("shards", True),
        ("shards", 2.0),
        ("priority", 0),
        ("priority", 1001),
        ("batch_size", 0),
        ("batch_size", 11),
        ("max_retries", -1),
        ("max_retries", None),
        ("visibility_timeout", 0),
        ("visibility_timeout", MAX_VISIBILITY_SECONDS + 1),
        ("time_limit", 0),
        ("time_limit", -5),
        ("time_limit", MAX_VISIBILITY_SECONDS + 1),
        ("time_limit", "10"),
        ("time_limit", False),
        ("queue_name", "has space"),
        ("queue_name", "dots.not.allowed"),
        ("queue_name", "trailing-newline\n"),
        ("queue_name", ""),
        ("queue_name", 42),
        ("queue_name", "q" * (MAX_BASE_NAME_LENGTH + 1)),
    ],
)
def test_an_invalid_attribute_is_refused_when_the_class_is_defined(
    attribute: str, value: Any
) -> None:
    # given an invalid value for one attribute
    # when a worker class declares it
    with pytest.raises(WorkerDefinitionError) as caught:
        define("Broken", **{attribute: value})
    # then the error names the class and the attribute
    assert f"Broken.{attribute}:" in str(caught.value)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("shards", 1),
        ("shards", 1000),
        ("priority", 1000),
        ("batch_size", 10),
        ("max_retries", 10_000),
        ("visibility_timeout", MAX_VISIBILITY_SECONDS),
        ("time_limit", 0.5),
        ("time_limit", 59.9),  # below the default visibility_timeout of 60
        ("queue_name", "q" * MAX_BASE_NAME_LENGTH),
    ],
)
def test_boundary_values_are_accepted(attribute: str, value: Any) -> None:
    # when a worker declares a value at the edge of the allowed range
    worker = define("Edge", **{attribute: value})
    # then the class is defined with that value
    assert getattr(worker.default_settings(), attribute) == value


@pytest.mark.parametrize(("time_limit", "visibility_timeout"), [(60, 60), (90, 60), (7200, 30)])
def test_a_time_limit_not_below_the_visibility_timeout_is_refused(
    time_limit: float, visibility_timeout: int
) -> None:
    # given a time limit as long as the visibility timeout, or longer
    # when a worker class declares both
    with pytest.raises(WorkerDefinitionError) as caught:
        define("Slow", time_limit=time_limit, visibility_timeout=visibility_timeout)
    # then the error names the class, both settings and what to do
    message = str(caught.value)
    assert message.startswith("Slow: time_limit")
    assert "visibility_timeout" in message and "raise visibility_timeout" in message


def test_a_config_override_that_puts_the_time_limit_past_the_visibility_is_refused() -> None:
    # given a worker whose time limit is below its visibility timeout
    worker = define("Tight", time_limit=20, visibility_timeout=30)
    # when the config lowers the visibility timeout to the time limit
    with pytest.raises(ConfigError) as caught:
        worker.default_settings().with_overrides({"visibility_timeout": 20}, "shardq.yaml")
    # then the error names the file, the worker and the rule
    assert "shardq.yaml: workers.Tight: time_limit (20 s) must be below" in str(caught.value)


def test_a_worker_without_perform_is_refused() -> None:
    # when a concrete worker class does not define perform
    with pytest.raises(WorkerDefinitionError, match=r"NoPerform must define perform"):

        class NoPerform(shardq.Worker):
            shards = 2


def _no_entity(self: Any, payloads: list[Any]) -> None:
    return None


def _keyword_only(self: Any, *, entity_id: str, payloads: list[Any]) -> None:
    return None


@pytest.mark.parametrize("perform", [_no_entity, _keyword_only, 5, staticmethod(_perform)])
def test_a_perform_that_cannot_be_called_with_an_entity_and_payloads_is_refused(
    perform: Any,
) -> None:
    # given a perform missing an argument, taking keywords only, not callable, or a
    # static method that still expects self / when the class is defined / then it is
    # refused at once (every job would fail and end in the morgue)
    with pytest.raises(WorkerDefinitionError, match=r"^Odd\.perform must be a method "):
        define("Odd", perform=perform)


def _generator(self: Any, entity_id: str, payloads: list[Any]) -> Any:
    yield from payloads


async def _async_generator(self: Any, entity_id: str, payloads: list[Any]) -> Any:
    for payload in payloads:
        yield payload


@pytest.mark.parametrize("perform", [_generator, _async_generator])
def test_a_perform_that_yields_is_refused(perform: Any) -> None:
    # given a perform with a yield in it (calling it runs none of its body)
    # when the class is defined / then it is refused, rather than its jobs counted as
    # done without running
    with pytest.raises(WorkerDefinitionError, match=r"^Gen\.perform yields"):
        define("Gen", perform=perform)


async def _async_exhausted(self: Any, entity_id: str, payloads: list[Any], error: Any) -> None:
    return None


async def _async_retry_in(self: Any, attempt: int) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("hook", "method"),
    [("retries_exhausted", _async_exhausted), ("retry_in", _async_retry_in)],
)
def test_an_async_retries_exhausted_or_retry_in_is_refused(hook: str, method: Any) -> None:
    # given an async def hook (they are called synchronously: its body would never run)
    # when the class is defined / then it is refused, naming the hook
    with pytest.raises(WorkerDefinitionError, match=rf"^Hooks\.{hook} must be a plain def"):
        define("Hooks", **{hook: method})


def _flexible(self: Any, entity_id: str, *payloads: Any, **options: Any) -> None:
    return None


def _static(entity_id: str, payloads: list[Any]) -> None:
    return None


@pytest.mark.parametrize("perform", [_flexible, staticmethod(_static)])
def test_a_perform_that_accepts_an_entity_and_payloads_is_accepted(perform: Any) -> None:
    assert define("Fine", perform=perform).default_settings().name == "Fine"


def test_worker_definition_error_is_also_a_type_error() -> None:
    # so callers catching TypeError for bad class definitions still catch it
    with pytest.raises(TypeError):
        define("Broken", shards=0)


# -- permanent_errors --------------------------------------------------------------


def test_permanent_errors_default_to_permanent_error() -> None:
    assert define().permanent_errors == (PermanentError,)


def test_permanent_errors_may_list_exception_classes() -> None:
    # given a tuple of exception classes (an empty one too)
    worker = define(permanent_errors=(ValueError, KeyError, PermanentError))
    empty = define("Empty", permanent_errors=())
    # then both classes are defined as declared
    assert worker.permanent_errors == (ValueError, KeyError, PermanentError)
    assert empty.permanent_errors == ()


@pytest.mark.parametrize(
    "value",
    [
        ValueError,
        [ValueError],
        (ValueError, "KeyError"),
        (ValueError, 3),
        (int,),
        (ValueError(),),
        None,
    ],
)
def test_permanent_errors_must_be_a_tuple_of_exception_classes(value: Any) -> None:
    # when a worker declares something else as permanent_errors
    with pytest.raises(WorkerDefinitionError) as caught:
        define("Picky", permanent_errors=value)
    # then the error names the class attribute and what is expected
    message = str(caught.value)
    assert "Picky.permanent_errors" in message
    assert "tuple of exception classes" in message


# -- abstract base classes -----------------------------------------------------------


def test_an_abstract_worker_needs_no_perform() -> None:
    # when a base class is declared abstract without perform
    class Base(shardq.Worker, abstract=True):
        shards = 4

    # then it is defined, and it is not bound to any app
    assert Base.shards == 4
    assert Base.app is None


def test_an_abstract_worker_is_not_validated_but_its_concrete_subclasses_are() -> None:
    # given an abstract base with a value that only makes sense once overridden
    class Base(shardq.Worker, abstract=True):
        shards = 0

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # when a concrete subclass keeps the invalid value
    # then it is refused
    with pytest.raises(WorkerDefinitionError, match=r"Keeps\.shards"):

        class Keeps(Base):
            pass

    # and a concrete subclass that overrides it is accepted
    class Overrides(Base):
        shards = 3

    assert Overrides.default_settings().shards == 3


def test_a_concrete_subclass_inherits_perform_and_settings_from_an_abstract_base() -> None:
    # given an abstract base that defines perform and shared settings
    class Base(shardq.Worker, abstract=True):
        batch_size = 10
        max_retries = 2

        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # when a concrete subclass defines nothing but its name
    class ImportInvoice(Base):
        pass

    # then it has the shared settings and its own queue name
    settings = ImportInvoice.default_settings()
    assert (settings.batch_size, settings.max_retries) == (10, 2)
    assert settings.queue_name == "import-invoice"


def test_a_subclass_of_a_concrete_worker_inherits_its_perform() -> None:
    # given a concrete worker
    parent = define("Parent")

    # when it is subclassed without overriding perform
    class Child(parent):  # type: ignore[misc, valid-type]
        shards = 2

    # then perform is inherited and the subclass is valid
    assert Child.default_settings().shards == 2


# -- retry_in ------------------------------------------------------------------------


@pytest.fixture
def seeded_random() -> Any:
    """Make the jitter reproducible, and restore the global random state afterwards."""
    state = random.getstate()
    random.seed(20240601)
    try:
        yield
    finally:
        random.setstate(state)


@pytest.mark.usefixtures("seeded_random")
@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10, 15, 16, 20, 100, 10**9])
def test_retry_in_is_positive_and_at_most_twelve_hours(attempt: int) -> None:
    # given the default retry_in
    worker = define()()
    # when it is asked for a delay many times
    delays = [worker.retry_in(attempt) for _ in range(50)]
    # then every delay is positive and at most 12 hours
    assert all(0 < d <= MAX_VISIBILITY_SECONDS == 43200 for d in delays)


@pytest.mark.usefixtures("seeded_random")
@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 12])
def test_retry_in_jitters_within_half_to_all_of_two_to_the_attempt(attempt: int) -> None:
    # given the default retry_in
    worker = define()()
    base = 2.0**attempt
    # when it is asked for a delay many times
    delays = [worker.retry_in(attempt) for _ in range(200)]
    # then every delay is between 50 % and 100 % of 2**attempt
    assert all(0.5 * base <= d <= base for d in delays)
    # and the delays are actually spread over that range (jitter)
    assert min(delays) < 0.6 * base
    assert max(delays) > 0.9 * base


@pytest.mark.usefixtures("seeded_random")
def test_retry_in_grows_with_the_attempt() -> None:
    # given the default retry_in
    worker = define()()
    # when each attempt's delay is sampled (below the cap, 2**15 < 12 h < 2**16)
    for attempt in range(1, 15):
        earlier = [worker.retry_in(attempt) for _ in range(20)]
        later = [worker.retry_in(attempt + 1) for _ in range(20)]
        # then a later attempt never waits less than an earlier one
        assert min(later) >= max(earlier)
    # and the typical delay roughly doubles
    assert worker.retry_in(10) > worker.retry_in(3) * 10


@pytest.mark.usefixtures("seeded_random")
def test_retry_in_is_capped_at_twelve_hours_with_jitter() -> None:
    # given an attempt whose exponential delay would exceed 12 hours
    worker = define()()
    assert MAX_VISIBILITY_SECONDS < 2.0**16
    # when the delay is sampled
    delays = [worker.retry_in(16) for _ in range(200)]
    # then it is jittered below the 12 hour cap
    assert all(0.5 * 43200 <= d <= 43200 for d in delays)


def test_retry_in_can_be_overridden() -> None:
    # given a worker with its own retry policy
    worker = define(retry_in=lambda self, attempt: 7.0 * attempt)()
    # then it is used
    assert worker.retry_in(3) == 21.0


# -- publishing without an app --------------------------------------------------------


def test_publishing_an_unregistered_worker_says_how_to_register_it() -> None:
    # given a worker class that no app registered
    worker = define("Lonely")
    # when a job is published
    with pytest.raises(UnknownWorkerError) as caught:
        worker.publish("e1", {"x": 1})
    # then the error says how to register it
    message = str(caught.value)
    assert "Lonely is not registered" in message
    assert "@app.register" in message
    assert "class Lonely(shardq.Worker, app=app)" in message


def test_a_subclass_of_a_registered_worker_is_not_registered() -> None:
    # given a registered worker
    app = shardq.App(shardq.Config(), broker=shardq.MemoryBroker())
    parent = app.register(define("Parent"))

    # when it is subclassed
    class Child(parent):  # type: ignore[misc, valid-type]
        pass

    # then the subclass is not bound to the parent's app
    assert parent.app is app
    assert Child.app is None
    assert "Child" not in app.workers
