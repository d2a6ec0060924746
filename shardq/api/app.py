"""The app: a registry of worker classes bound to a config and a broker. Creating one does
no I/O (config and broker are made on first use); ``shardq run`` imports the module that
defines it (``--app``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from shardq.api.worker import Worker
from shardq.broker import Broker, broker_from_url
from shardq.core.config import Config
from shardq.core.errors import ConfigError, UnknownWorkerError, WorkerDefinitionError
from shardq.core.fleet_rules import ELASTIC
from shardq.core.jobs import WorkerSettings
from shardq.core.middleware import Middleware
from shardq.core.plan import Plan, make_plan
from shardq.core.topology import morgue_queue, parse_name, shard_name, shard_queue, too_long
from shardq.publish import Publisher
from shardq.store import Store, store_for
from shardq.store.layouts import Layouts

if TYPE_CHECKING:
    from shardq.run.node import Node

W = TypeVar("W", bound=type[Worker])


class App:
    """Worker classes, their config and the broker they publish to and run from."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        broker: Broker | None = None,
        store: Store | None = None,
    ) -> None:
        #: The config given in code; ``shardq run`` applies the file, environment and
        #: flags on top of it.
        self.base_config = config
        self._config, self._broker, self._store = config, broker, store
        self._workers: dict[str, type[Worker]] = {}
        self._settings: dict[str, WorkerSettings] = {}
        self._ready: set[str] = set()
        self._lock = threading.RLock()
        self.publisher = Publisher(self)
        #: The live layout of every worker (see :mod:`shardq.core.layout`).
        self.layouts = Layouts(self)
        #: Middleware around perform and publish, and node hooks, in order added.
        self.middleware: list[Middleware] = []

    def register(self, cls: W) -> W:
        """Register a worker class (usable as a class decorator)."""
        if not (isinstance(cls, type) and issubclass(cls, Worker)) or cls is Worker:
            raise WorkerDefinitionError(f"{cls!r} is not a shardq.Worker subclass")
        if cls.perform is Worker.perform:  # an abstract base
            raise WorkerDefinitionError(
                f"{cls.__name__} has no perform; register the concrete subclasses that define it"
            )
        with self._lock:
            other = self._workers.get(cls.__name__)
            if other is not None and other is not cls:
                raise WorkerDefinitionError(
                    f"another worker named {cls.__name__} is already registered "
                    f"({other.__module__}); worker names must be unique in an app"
                )
            if cls.app is not None and cls.app is not self:
                raise WorkerDefinitionError(f"{cls.__name__} is already registered with an app")
            cls.app = self
            self._workers[cls.__name__] = cls
            self._settings.pop(cls.__name__, None)
        return cls

    def add_middleware(self, middleware: Middleware) -> None:
        """Add a middleware (outermost first); see :mod:`shardq.core.middleware`."""
        if not isinstance(middleware, Middleware):
            raise TypeError(f"{middleware!r} is not a shardq.Middleware")
        for hook in ("around_perform", "around_publish", "on_node_start", "on_node_stop"):
            if inspect.iscoroutinefunction(getattr(middleware, hook)):
                raise TypeError(
                    f"{type(middleware).__name__}.{hook} is async: middleware are called "
                    "without awaiting (for async workers too); make it a plain def"
                )
        self.middleware.append(middleware)

    @property
    def workers(self) -> dict[str, type[Worker]]:
        """Registered worker classes by name, in registration order."""
        return dict(self._workers)

    def worker(self, name: str) -> type[Worker]:
        try:
            return self._workers[name]
        except KeyError:
            known = ", ".join(sorted(self._workers)) or "none"
            raise UnknownWorkerError(
                f"no worker named {name!r} is registered (known: {known}); check the name "
                "or the --app module"
            ) from None

    def settings(self, worker: type[Worker] | str) -> WorkerSettings:
        """A worker's settings with the config's overrides applied."""
        name = worker if isinstance(worker, str) else worker.__name__
        if name not in self._settings:
            overrides = self.config.workers.get(name, {})
            defaults = self.worker(name).default_settings()
            self._settings[name] = defaults.with_overrides(overrides, self.config.source)
        return self._settings[name]

    def check(self) -> None:
        """Validate the config against the workers: names, overrides, queue names."""
        if unknown := sorted(set(self.config.workers) - set(self._workers)):
            raise ConfigError(
                f"{self.config.source}: workers: {', '.join(unknown)} not registered "
                f"(known: {', '.join(sorted(self._workers)) or 'none'})"
            )
        seen: dict[str, str] = {}
        for name in self._workers:
            settings = self.settings(name)
            if problem := too_long(self.morgue_queue(name)):
                raise ConfigError(
                    f"{self.config.source}: queue_prefix + {name}'s queue_name give {problem}"
                )
            if settings.queue_name in seen:
                raise ConfigError(
                    f"workers {seen[settings.queue_name]} and {name} share the queue_name "
                    f"{settings.queue_name!r}; give one of them another queue_name"
                )
            seen[settings.queue_name] = name

    def plan(self, *, node: int = 0, nodes: int = 1, threads: int | None = None) -> Plan:
        """The plan of node ``node`` of ``nodes`` (threads default to the config's), over
        the live layout's shards (the copy in hand: no request)."""
        workers = {
            name: (count, self.settings(worker).priority)
            for worker in self._workers
            for name, count in self.live_shards(worker).items()
        }
        threads = self.config.threads if threads is None else threads
        return make_plan(workers, node=node, nodes=nodes, threads=threads)

    def node(
        self, plan: Plan | None = None, *, membership: str | None = None, **options: Any
    ) -> Node:
        """A node of this app running ``plan`` (default: every shard on one node), with
        its part in reshards and, given ``membership`` (``elastic``/``static``), in a
        fleet. ``options``: those of :class:`~shardq.run.node.Node`."""
        from shardq.fleet import Fleet  # a node's parts: imported by who runs one
        from shardq.reshard.layout_keeper import LayoutKeeper
        from shardq.run.node import Node

        fleet = None if membership is None else (lambda n: Fleet(n, elastic=membership == ELASTIC))
        plan = self.plan() if plan is None else plan
        return Node(self, plan, keeper=LayoutKeeper, fleet=fleet, **options)

    @property
    def config(self) -> Config:
        with self._lock:
            if self._config is None:
                self._config = Config.load()
            return self._config

    @property
    def broker(self) -> Broker:
        with self._lock:
            if self._broker is None:
                cfg = self.config
                self._broker = broker_from_url(
                    cfg.broker_url,
                    region=cfg.region,
                    endpoint_url=cfg.endpoint_url,
                    connect_timeout=cfg.connect_timeout,
                    read_timeout=cfg.read_timeout,
                )
            return self._broker

    @property
    def store(self) -> Store:
        """The state store (leases, layouts, dead jobs): given, or made for the broker."""
        with self._lock:
            if self._store is None:
                self._store = store_for(self.config, self.broker)
            return self._store

    def configure(self, config: Config | None = None, *, broker: Broker | None = None) -> None:
        """Replace the config and/or broker (the CLI does this before running)."""
        with self._lock:
            if config is not None and broker is None and self._broker is not None:
                self._broker.close()  # made for the old config, as is the store
                self._broker = None
                self._store = None
            self._use(config, broker)

    @contextmanager
    def override(
        self, config: Config | None = None, *, broker: Broker | None = None
    ) -> Iterator[App]:
        """Use another config and/or broker inside the block, then restore (tests)."""
        with self._lock:
            saved = self._config, self._broker, self._store, self._settings, self._ready
            self._use(config, broker)
        try:
            yield self
        finally:
            with self._lock:
                self._config, self._broker, self._store, self._settings, self._ready = saved
                self.layouts.forget()

    def _use(self, config: Config | None, broker: Broker | None) -> None:
        if config is not None:
            self._config = config
            self._settings = {}  # new ones: ``override`` keeps the old to restore
        if broker is not None:
            self._broker = broker
            self._store = None
        self._ready = set()
        self.layouts.forget()

    @property
    def signing_key(self) -> bytes | None:
        key = self.config.signing_key
        return key.encode("utf-8") if key else None

    def shard_queue(self, worker: type[Worker] | str, shard: int, gen: int = 0) -> str:
        """The queue of shard ``shard`` of layout generation ``gen``."""
        return shard_queue(self.config.queue_prefix, self.settings(worker).queue_name, shard, gen)

    def live_shards(self, worker: str) -> dict[str, int]:
        """Shards to serve now by generation name (``Orders``, ``Orders@2``): the
        current layout's and, during a reshard, the old one's (the copy in hand)."""
        layout = self.layouts.cached(worker)
        gens = {layout.gen: layout.shards}
        if layout.moving is not None:
            gens[layout.moving.gen] = layout.moving.shards
        return {shard_name(worker, g): n for g, n in sorted(gens.items())}

    def morgue_queue(self, worker: type[Worker] | str) -> str:
        return morgue_queue(self.config.queue_prefix, self.settings(worker).queue_name)

    def ensure_queue(self, queue: str, worker: type[Worker] | str) -> None:
        """Create ``queue`` once per app (a no-op after the first call)."""
        if queue in self._ready:
            return
        self.broker.ensure_queue(queue, visibility_timeout=self.settings(worker).visibility_timeout)
        self._ready.add(queue)

    def ensure_queues(self) -> list[str]:
        """Create the state store's table and every shard queue of the live layouts;
        returns the queues' names."""
        self.check()
        self.store.ensure_table()
        self.layouts.refresh()
        names = []
        for name in self._workers:
            for gen_name, count in self.live_shards(name).items():
                gen = parse_name(gen_name)[1]
                for shard in range(count):
                    names.append(self.shard_queue(name, shard, gen))
                    self.ensure_queue(names[-1], name)
        return names
