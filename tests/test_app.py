"""The app: registering workers, their effective settings, config checks and queues."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import shardq
from shardq.core.errors import ConfigError, UnknownWorkerError, WorkerDefinitionError
from shardq.core.limits import MAX_QUEUE_NAME_LENGTH


def _perform(self: Any, entity_id: str, payloads: list[Any]) -> None:
    return None


def define(name: str, **attrs: Any) -> type[shardq.Worker]:
    return type(name, (shardq.Worker,), {"perform": _perform, **attrs})


@pytest.fixture
def broker() -> Iterator[shardq.MemoryBroker]:
    instance = shardq.MemoryBroker()
    try:
        yield instance
    finally:
        instance.close()


def make_app(broker: shardq.Broker, **config: Any) -> shardq.App:
    return shardq.App(shardq.Config(**config), broker=broker)


# -- registering -----------------------------------------------------------------


def test_the_register_decorator_registers_and_returns_the_class(
    broker: shardq.MemoryBroker,
) -> None:
    # given an app
    app = make_app(broker)

    # when a worker class is decorated with app.register
    @app.register
    class SyncOrder(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # then the class itself is kept, bound to the app and listed by name
    assert isinstance(SyncOrder, type)
    assert SyncOrder.app is app
    assert app.workers == {"SyncOrder": SyncOrder}
    assert app.worker("SyncOrder") is SyncOrder


def test_the_app_class_keyword_registers_the_class(broker: shardq.MemoryBroker) -> None:
    # given an app
    app = make_app(broker)

    # when a worker class names it as a class keyword
    class SyncOrder(shardq.Worker, app=app):
        def perform(self, entity_id: str, payloads: list[Any]) -> None:
            pass

    # then it is registered with that app
    assert SyncOrder.app is app
    assert app.worker("SyncOrder") is SyncOrder


def test_workers_are_listed_in_registration_order(broker: shardq.MemoryBroker) -> None:
    # given an app
    app = make_app(broker)
    # when three workers are registered
    names = ["Zeta", "Alpha", "Mid"]
    for name in names:
        app.register(define(name))
    # then they are listed in that order
    assert list(app.workers) == names


def test_registering_the_same_class_twice_is_harmless(broker: shardq.MemoryBroker) -> None:
    # given a registered worker
    app = make_app(broker)
    worker = app.register(define("Once"))
    # when it is registered again
    app.register(worker)
    # then it is still registered once
    assert app.workers == {"Once": worker}


def test_two_workers_with_the_same_name_are_refused(broker: shardq.MemoryBroker) -> None:
    # given a registered worker named Report
    app = make_app(broker)
    first = app.register(define("Report"))
    # when another class named Report is registered
    with pytest.raises(WorkerDefinitionError) as caught:
        app.register(define("Report"))
    # then it is refused with the reason, and the first one stays
    assert "another worker named Report is already registered" in str(caught.value)
    assert app.worker("Report") is first


def test_a_class_keyword_duplicate_is_refused_at_class_definition(
    broker: shardq.MemoryBroker,
) -> None:
    # given a registered worker named Report
    app = make_app(broker)
    app.register(define("Report"))
    # when another class named Report declares app=app
    with pytest.raises(WorkerDefinitionError, match="already registered"):

        class Report(shardq.Worker, app=app):
            def perform(self, entity_id: str, payloads: list[Any]) -> None:
                pass


def test_a_worker_cannot_be_registered_with_two_apps(broker: shardq.MemoryBroker) -> None:
    # given a worker registered with one app
    first, second = make_app(broker), make_app(broker)
    worker = first.register(define("Shared"))
    # when another app registers it
    with pytest.raises(WorkerDefinitionError, match="Shared is already registered with an app"):
        second.register(worker)
    # then it stays bound to the first
    assert worker.app is first
    assert second.workers == {}


@pytest.mark.parametrize("thing", [shardq.Worker, int, "SyncOrder", object()])
def test_only_worker_subclasses_can_be_registered(broker: shardq.MemoryBroker, thing: Any) -> None:
    app = make_app(broker)
    # when something that is not a Worker subclass is registered
    with pytest.raises(WorkerDefinitionError, match=r"is not a shardq\.Worker subclass"):
        app.register(thing)
    # then nothing is registered
    assert app.workers == {}


def test_an_abstract_worker_without_perform_cannot_be_registered(
    broker: shardq.MemoryBroker,
) -> None:
    # given an abstract base class (no perform of its own)
    class Base(shardq.Worker, abstract=True):
        shards = 4

    app = make_app(broker)
    # when it is registered / then it is refused, saying to register its subclasses,
    # and nothing is registered (its every job would fail into the morgue)
    with pytest.raises(WorkerDefinitionError, match=r"^Base has no perform; register"):
        app.register(Base)
    assert app.workers == {}


def test_an_unknown_worker_name_says_what_is_known_and_what_to_check(
    broker: shardq.MemoryBroker,
) -> None:
    # given an app with two workers
    app = make_app(broker)
    app.register(define("Beta"))
    app.register(define("Alpha"))
    # when a name that is not registered is looked up
    with pytest.raises(UnknownWorkerError) as caught:
        app.worker("Gamma")
    # then the error lists the known workers and what to check
    message = str(caught.value)
    assert "'Gamma'" in message
    assert "known: Alpha, Beta" in message
    assert "--app" in message


def test_an_unknown_worker_name_in_an_empty_app_says_none_are_known(
    broker: shardq.MemoryBroker,
) -> None:
    app = make_app(broker)
    with pytest.raises(UnknownWorkerError, match=r"known: none"):
        app.worker("Anything")


def test_settings_of_an_unknown_worker_raise_unknown_worker_error(
    broker: shardq.MemoryBroker,
) -> None:
    app = make_app(broker)
    with pytest.raises(UnknownWorkerError):
        app.settings("Missing")


# -- settings ---------------------------------------------------------------------


def test_settings_without_overrides_are_the_class_defaults(broker: shardq.MemoryBroker) -> None:
    # given a registered worker and a config without overrides
    app = make_app(broker)
    worker = app.register(define("SyncOrder", shards=8, batch_size=5))
    # then its settings are those of the class, by class or by name
    assert app.settings(worker) == worker.default_settings()
    assert app.settings("SyncOrder") == worker.default_settings()


def test_config_overrides_replace_only_the_named_settings(broker: shardq.MemoryBroker) -> None:
    # given a config overriding two settings of one worker
    app = make_app(broker, workers={"SyncOrder": {"shards": 16, "queue_name": "orders"}})
    worker = app.register(define("SyncOrder", shards=8, batch_size=5))
    # when its settings are read
    settings = app.settings(worker)
    # then the overridden ones change and the others keep the class values
    assert settings.shards == 16
    assert settings.queue_name == "orders"
    assert settings.batch_size == 5
    assert settings.name == "SyncOrder"


def test_an_invalid_override_names_the_key_and_the_source(broker: shardq.MemoryBroker) -> None:
    # given a config from a file overriding shards with an invalid value
    config = shardq.Config(workers={"SyncOrder": {"shards": 0}}, source="shardq.yaml")
    app = shardq.App(config, broker=broker)
    app.register(define("SyncOrder"))
    # when the settings are read
    with pytest.raises(ConfigError) as caught:
        app.settings("SyncOrder")
    # then the error names the file, the worker and the key
    message = str(caught.value)
    assert message.startswith("shardq.yaml: workers.SyncOrder.shards:")
    assert "got 0" in message


def test_an_override_of_something_that_is_not_a_setting_is_refused(
    broker: shardq.MemoryBroker,
) -> None:
    # given a config overriding an unknown setting
    config = shardq.Config(workers={"SyncOrder": {"shard": 4}}, source="shardq.yaml")
    app = shardq.App(config, broker=broker)
    app.register(define("SyncOrder"))
    # when the settings are read
    with pytest.raises(ConfigError) as caught:
        app.settings("SyncOrder")
    # then the error names the key and lists the real settings
    message = str(caught.value)
    assert "workers.SyncOrder.shard is not a worker setting" in message
    assert "shards" in message


def test_configure_with_a_new_config_applies_its_overrides(broker: shardq.MemoryBroker) -> None:
    # given an app whose settings were already read
    app = make_app(broker)
    app.register(define("SyncOrder"))
    assert app.settings("SyncOrder").shards == 1
    # when it is given a config with an override (and the same broker)
    app.configure(shardq.Config(workers={"SyncOrder": {"shards": 3}}), broker=broker)
    # then the new override is used
    assert app.settings("SyncOrder").shards == 3


# -- check -------------------------------------------------------------------------


def test_check_passes_for_a_consistent_config(broker: shardq.MemoryBroker) -> None:
    app = make_app(broker, queue_prefix="prod-", workers={"A": {"shards": 2}})
    app.register(define("A"))
    app.register(define("B"))
    app.check()


def test_check_refuses_config_for_workers_that_are_not_registered(
    broker: shardq.MemoryBroker,
) -> None:
    # given a config with overrides for two workers that the app does not have
    config = shardq.Config(
        workers={"SyncOrder": {"shards": 2}, "Typo": {}, "Other": {}}, source="shardq.yaml"
    )
    app = shardq.App(config, broker=broker)
    app.register(define("SyncOrder"))
    # when the app checks its config
    with pytest.raises(ConfigError) as caught:
        app.check()
    # then the error names the source, the unknown names and the known ones
    message = str(caught.value)
    assert message.startswith("shardq.yaml: workers: Other, Typo not registered")
    assert "known: SyncOrder" in message


def test_check_refuses_queue_names_too_long_with_the_prefix(
    broker: shardq.MemoryBroker,
) -> None:
    # given a worker whose queue name fits alone but not with the prefix
    name = "q" * 60
    app = make_app(broker, queue_prefix="production-eu-west-1-")
    app.register(define("Long", queue_name=name))
    # when the app checks its config
    with pytest.raises(ConfigError) as caught:
        app.check()
    # then the error names the too long queue name and the limit
    longest = f"production-eu-west-1-{name}-morgue.fifo"
    message = str(caught.value)
    assert longest in message
    assert f"({len(longest)} characters)" in message
    assert f"SQS allows {MAX_QUEUE_NAME_LENGTH}" in message


def test_a_queue_name_of_exactly_the_limit_passes_the_check(
    broker: shardq.MemoryBroker,
) -> None:
    # given a prefix and queue name whose morgue queue is exactly 80 characters
    prefix = "p-"
    name = "q" * (MAX_QUEUE_NAME_LENGTH - len(prefix) - len("-morgue.fifo"))
    app = make_app(broker, queue_prefix=prefix)
    app.register(define("Exact", queue_name=name))
    # then the check passes
    app.check()
    assert len(app.morgue_queue("Exact")) == MAX_QUEUE_NAME_LENGTH


def test_check_refuses_two_workers_sharing_a_queue_name(broker: shardq.MemoryBroker) -> None:
    # given two workers with the same queue_name
    app = make_app(broker)
    app.register(define("First", queue_name="jobs"))
    app.register(define("Second", queue_name="jobs"))
    # when the app checks its config
    with pytest.raises(ConfigError) as caught:
        app.check()
    # then the error names both workers and the queue name
    message = str(caught.value)
    assert "workers First and Second share the queue_name 'jobs'" in message


def test_check_refuses_a_shared_queue_name_made_by_a_config_override(
    broker: shardq.MemoryBroker,
) -> None:
    # given a config giving a worker the default queue name of another
    app = make_app(broker, workers={"Second": {"queue_name": "first"}})
    app.register(define("First"))
    app.register(define("Second"))
    # then the check refuses it
    with pytest.raises(ConfigError, match="share the queue_name 'first'"):
        app.check()


def test_check_reports_invalid_overrides(broker: shardq.MemoryBroker) -> None:
    app = make_app(broker, workers={"A": {"batch_size": 11}})
    app.register(define("A"))
    with pytest.raises(ConfigError, match=r"workers\.A\.batch_size"):
        app.check()


# -- queues -------------------------------------------------------------------------


def test_queue_names_combine_prefix_queue_name_and_shard(broker: shardq.MemoryBroker) -> None:
    app = make_app(broker, queue_prefix="prod-")
    app.register(define("SyncOrder", shards=4))
    assert app.shard_queue("SyncOrder", 3) == "prod-sync-order-3.fifo"
    assert app.morgue_queue("SyncOrder") == "prod-sync-order-morgue.fifo"


def test_ensure_queues_creates_every_shard_queue_and_no_morgue_queue(
    broker: shardq.MemoryBroker,
) -> None:
    # given two workers, one with three shards (set by config) and one with one
    app = make_app(broker, queue_prefix="t-", workers={"SyncOrder": {"shards": 3}})
    app.register(define("SyncOrder"))
    app.register(define("HTTPPing"))
    # when the app ensures its queues
    names = app.ensure_queues()
    # then every shard queue is created (dead jobs live in the state store)
    expected = [
        "t-sync-order-0.fifo",
        "t-sync-order-1.fifo",
        "t-sync-order-2.fifo",
        "t-http-ping-0.fifo",
    ]
    assert names == expected
    for queue in expected:
        counts = broker.counts(queue)
        assert (counts.waiting, counts.in_flight) == (0, 0)


def test_ensure_queues_is_idempotent(broker: shardq.MemoryBroker) -> None:
    # given an app whose queues exist
    app = make_app(broker)
    app.register(define("SyncOrder", shards=2))
    first = app.ensure_queues()
    # when they are ensured again (also by a second app on the same broker)
    second = app.ensure_queues()
    other = make_app(broker)
    other.register(define("SyncOrder", shards=2))
    third = other.ensure_queues()
    # then the same queues are reported and nothing fails
    assert first == second == third


def test_ensure_queues_checks_the_config_first(broker: shardq.MemoryBroker) -> None:
    # given a config naming an unregistered worker
    app = make_app(broker, workers={"Ghost": {}})
    app.register(define("Real"))
    # when queues are ensured
    with pytest.raises(ConfigError, match="Ghost"):
        app.ensure_queues()
    # then no queue was created
    with pytest.raises(shardq.QueueNotFoundError):
        broker.counts("real-0.fifo")


def test_signing_key_is_the_configured_key_as_bytes(broker: shardq.MemoryBroker) -> None:
    assert make_app(broker).signing_key is None
    assert make_app(broker, signing_key="s3cr\u00e9t").signing_key == "s3cr\u00e9t".encode()
