"""Configuration: defaults < ``shardq.yaml`` < ``SHARDQ_*`` environment < CLI flags.

``shardq.yaml`` (YAML, read safely; a key given twice is refused)::

    broker_url: sqs://            # or sqlite:///shardq.db (default), memory://
    region: eu-west-1
    endpoint_url: null            # e.g. http://127.0.0.1:4566 for an emulator
    store_url: null               # e.g. dynamodb://?region=eu-west-2&table=prod-state
    queue_prefix: prod-
    threads: 8
    concurrency: 32
    workers:
      SyncOrder: {shards: 16, batch_size: 10}

Every top-level key can be set as ``SHARDQ_<KEY>`` (``SHARDQ_THREADS=8``) and a
worker setting as ``SHARDQ_WORKERS__<Worker>__<key>`` (``SHARDQ_WORKERS__SyncOrder__shards=16``).
AWS credentials are never read from here: boto3's default chain provides them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import yaml

from shardq.errors import ConfigError
from shardq.limits import MAX_CONCURRENCY, MAX_THREADS, MAX_WAIT_SECONDS, QUEUE_NAME_PATTERN

DEFAULT_FILE = "shardq.yaml"
ENV_PREFIX = "SHARDQ_"
_LOG_FORMATS = ("auto", "console", "json")
_LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Config:
    """Everything a publisher or node needs besides the worker classes."""

    #: Where the queues live.
    broker_url: str = "sqlite:///shardq.db"
    #: AWS region for ``sqs://`` (else boto3's default chain decides).
    region: str | None = None
    #: SQS endpoint override, for emulators.
    endpoint_url: str | None = None
    #: Where the state store lives (None: the broker's file, or DynamoDB for ``sqs://``
    #: in the SQS region/endpoint); ``dynamodb://?region=..&endpoint_url=..&table=..``.
    store_url: str | None = None
    #: Prepended to every queue name (``prod-`` -> ``prod-sync-order-3.fifo``).
    queue_prefix: str = ""
    #: Python module (``pkg.mod`` or ``pkg.mod:app``) defining the app and its workers.
    app: str = "workers"
    #: Threads per node; each shard of the node belongs to exactly one (1..256).
    threads: int = 4
    #: Most jobs a node runs at once, over all its shards (one entity at a time in
    #: order; 1..MAX_CONCURRENCY).
    concurrency: int = 32
    #: Seconds running jobs get to finish after the first SIGTERM/SIGINT.
    grace_seconds: float = 30.0
    #: Longest wait of one long poll on an idle shard (SQS allows at most 20).
    idle_wait_seconds: float = 20.0
    #: Receives each node thread keeps in flight while it runs a batch (1..10).
    prefetch: int = 2
    #: Seconds between ``node.progress`` log events (0: none).
    progress_seconds: float = 10.0
    #: Elastic fleet: a killed node's shards are taken by others within this (its
    #: heartbeat counter must stand still that long less a beat and 2 s; 10..600).
    lease_seconds: float = 30.0
    #: Unused since the fleet lives in the state store (5..45, still accepted).
    report_seconds: float = 45.0
    #: Publishers and nodes look at the live layout (``shardq reshard``) again when
    #: their copy is older than this (0.1..60).
    layout_refresh_seconds: float = 10.0
    #: ``shardq reshard``: publishers switch to the new layout this long after the
    #: reshard begins (every one must have looked at the layout by then: 5..3600, and
    #: at least layout_refresh_seconds + 5).
    reshard_trust_seconds: float = 60.0
    #: A node warns (``job.old``) about a job older than this share of its queue's
    #: retention period (0: never; 0..1).
    retention_warning_share: float = 0.5
    #: Shared HMAC key; when set, bodies are signed and unsigned ones refused.
    signing_key: str | None = None
    #: Port of the node's Prometheus ``/metrics`` endpoint (None: no endpoint).
    metrics_port: int | None = None
    #: Address the metrics endpoint binds (0.0.0.0 to let Prometheus on another host scrape).
    metrics_host: str = "127.0.0.1"
    #: Dead jobs older than this many days are deleted by ``shardq queues ensure``
    #: (None: kept until purged).
    morgue_retention_days: int | None = None
    #: Token the dashboard's actions require (``Authorization: Bearer <token>``).
    dashboard_token: str | None = None
    #: ``console`` (readable), ``json`` (one object per line) or ``auto`` (console on a tty).
    log_format: str = "auto"
    log_level: str = "info"
    #: Per-worker overrides: ``{WorkerName: {setting: value}}``.
    workers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Where the values came from, for error messages.
    source: str = "defaults"

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        base: Config | None = None,
    ) -> Config:
        """Start from ``base`` (an app's own config) or the defaults, then apply the file
        (``path``, ``$SHARDQ_CONFIG`` or ``./shardq.yaml`` if present), the environment,
        and ``overrides`` (CLI flags; None values skipped)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources = []
        if base is not None:
            values = {key: getattr(base, key) for key in _FIELDS}
            values["workers"] = {k: dict(v) for k, v in base.workers.items()}
            sources.append("the app's config")
        file_path = path or env.get(ENV_PREFIX + "CONFIG")
        if file_path is None and Path(DEFAULT_FILE).is_file():
            file_path = DEFAULT_FILE
        if file_path is not None:
            from_file = _read_file(Path(file_path))
            if isinstance(from_file.get("workers"), Mapping) and "workers" in values:
                from_file["workers"] = _merge_workers(values["workers"], from_file["workers"])
            values.update(from_file)
            sources.append(str(file_path))
        env_values = _from_env(env)
        if env_values:
            workers = values.get("workers") or {}
            if not isinstance(workers, Mapping) or not all(
                isinstance(v, Mapping) for v in workers.values()
            ):
                raise ConfigError(
                    f"{file_path}: workers: expected a mapping of worker name to a mapping "
                    "of settings"
                )
            workers = {k: dict(v) for k, v in workers.items()}
            for name, settings in env_values.pop("workers", {}).items():
                workers.setdefault(name, {}).update(settings)
            values.update(env_values)
            if workers:
                values["workers"] = workers
            sources.append("environment")
        for key, value in (overrides or {}).items():
            if value is not None:
                values[key] = value
                sources.append(f"--{key.replace('_', '-')}")
        values["source"] = " + ".join(dict.fromkeys(sources)) or "defaults"
        return cls(**_coerce(values, values["source"]))

    def with_overrides(self, **changes: Any) -> Config:
        """A copy with some values replaced (None values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes)

    def _validate(self) -> None:
        where = self.source

        def fail(key: str, problem: str) -> None:
            raise ConfigError(f"{where}: {key}: {problem}")

        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            fail("threads", f"expected an integer >= 1, got {self.threads!r}")
        if self.threads > MAX_THREADS:
            fail("threads", f"expected an integer from 1 to {MAX_THREADS}, got {self.threads!r}")
        if (
            not isinstance(self.concurrency, int)
            or isinstance(self.concurrency, bool)
            or not 1 <= self.concurrency <= MAX_CONCURRENCY
        ):
            fail(
                "concurrency",
                f"expected an integer from 1 to {MAX_CONCURRENCY}, got {self.concurrency!r}",
            )
        if not 0 <= self.grace_seconds <= 3600:
            fail("grace_seconds", f"expected 0 to 3600, got {self.grace_seconds!r}")
        if not 0 < self.idle_wait_seconds <= MAX_WAIT_SECONDS:
            fail("idle_wait_seconds", f"expected more than 0 and at most {MAX_WAIT_SECONDS}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int):
            fail("prefetch", f"expected an integer from 1 to 10, got {self.prefetch!r}")
        if not 1 <= self.prefetch <= 10:
            fail("prefetch", f"expected an integer from 1 to 10, got {self.prefetch!r}")
        if not 0 <= self.progress_seconds <= 86400:
            fail("progress_seconds", f"expected 0 to 86400, got {self.progress_seconds!r}")
        days = self.morgue_retention_days
        if days is not None and (type(days) is not int or not 1 <= days <= 36500):
            fail("morgue_retention_days", f"expected whole days from 1 to 36500, got {days!r}")
        if not 10 <= self.lease_seconds <= 600:
            fail("lease_seconds", f"expected 10 to 600, got {self.lease_seconds!r}")
        if not 5 <= self.report_seconds <= 45:
            fail("report_seconds", f"expected 5 to 45, got {self.report_seconds!r}")
        if not 0.1 <= self.layout_refresh_seconds <= 60:
            fail(
                "layout_refresh_seconds", f"expected 0.1 to 60, got {self.layout_refresh_seconds!r}"
            )
        if not 5 <= self.reshard_trust_seconds <= 3600:
            fail("reshard_trust_seconds", f"expected 5 to 3600, got {self.reshard_trust_seconds!r}")
        if self.reshard_trust_seconds < self.layout_refresh_seconds + 5:
            fail(
                "reshard_trust_seconds",
                f"{self.reshard_trust_seconds} is less than layout_refresh_seconds "
                f"({self.layout_refresh_seconds}) + 5: publishers could still use the old "
                "layout when old shards close",
            )
        if self.queue_prefix and not QUEUE_NAME_PATTERN.fullmatch(self.queue_prefix):
            fail(
                "queue_prefix", f"expected letters, digits, '-' and '_', got {self.queue_prefix!r}"
            )
        if self.log_format not in _LOG_FORMATS:
            fail("log_format", f"expected one of {', '.join(_LOG_FORMATS)}")
        if self.log_level not in _LOG_LEVELS:
            fail("log_level", f"expected one of {', '.join(_LOG_LEVELS)}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            fail("metrics_port", f"expected a port from 0 to 65535, got {self.metrics_port!r}")
        if "://" not in self.broker_url:
            fail(
                "broker_url", f"expected a URL such as sqlite:///shardq.db, got {self.broker_url!r}"
            )
        if self.endpoint_url is not None:
            url = urlsplit(str(self.endpoint_url))
            if url.scheme not in ("http", "https") or not url.hostname:
                fail(
                    "endpoint_url",
                    "expected an http:// or https:// URL such as http://127.0.0.1:4566, "
                    f"got {self.endpoint_url!r}",
                )
            try:
                url.port  # noqa: B018 (raises for a port that is not a number)
            except ValueError:
                fail("endpoint_url", f"the port of {self.endpoint_url!r} is not a number")
        if self.store_url is not None:
            from shardq.store import store_parameters

            store_parameters(self.store_url, where)
        if not 0 <= self.retention_warning_share <= 1:
            fail(
                "retention_warning_share",
                f"expected 0 (off) to 1, got {self.retention_warning_share!r}",
            )
        if not isinstance(self.workers, Mapping) or not all(
            isinstance(v, Mapping) for v in self.workers.values()
        ):
            fail("workers", "expected a mapping of worker name to a mapping of settings")


_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "source"}
_INTS = {"threads", "prefetch", "concurrency"}
_OPTIONAL_INTS = {"metrics_port", "morgue_retention_days"}
_FLOATS = {
    "grace_seconds",
    "idle_wait_seconds",
    "progress_seconds",
    "lease_seconds",
    "report_seconds",
    "layout_refresh_seconds",
    "reshard_trust_seconds",
    "retention_warning_share",
}


def _merge_workers(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Per-worker settings of ``overrides`` on top of ``base`` (invalid shapes are kept
    as they are, for validation to report)."""
    merged = {name: dict(settings) for name, settings in base.items()}
    for name, settings in overrides.items():
        if isinstance(settings, Mapping) and isinstance(merged.get(name), dict):
            merged[name].update(settings)
        else:
            merged[name] = settings
    return merged


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {', '.join(map(str, unknown))}; known keys: "
            f"{', '.join(sorted(_FIELDS))}"
        )
    return data


class _DuplicateKey(yaml.YAMLError):
    """A mapping of the file names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a mapping that names a key twice (YAML says keys
    are unique; PyYAML would silently keep the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML reports it below
                continue
            if first != line:
                raise _DuplicateKey(
                    f"duplicate key {key!r} on line {line} (first on line {first}); "
                    "keep one of them"
                )
        return super().construct_mapping(node, deep=deep)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        key = name[len(ENV_PREFIX) :]
        if key.upper().startswith("WORKERS__") and not key.startswith("WORKERS__"):
            parts = key.split("__")
            _unknown_env(name, ENV_PREFIX + "__".join(["WORKERS", *parts[1:]]))
        if key.startswith("WORKERS__"):
            parts = key.split("__")
            if len(parts) != 3 or not all(parts):
                raise ConfigError(f"environment: {name}: expected SHARDQ_WORKERS__<Worker>__<key>")
            values.setdefault("workers", {}).setdefault(parts[1], {})[parts[2].lower()] = (
                _env_scalar(raw)
            )
        elif key.lower() in _FIELDS and key.lower() != "workers" and key == key.upper():
            values[key.lower()] = raw
        elif (key.lower() in _FIELDS and key.lower() != "workers") or key.upper() == "CONFIG":
            _unknown_env(name, ENV_PREFIX + key.upper())
        else:
            _unknown_env(name, None)
    return values


def _unknown_env(name: str, hint: str | None) -> NoReturn:
    """Refuse ``name``; ``hint``: the variable it was probably meant to be."""
    if hint is not None:
        raise ConfigError(
            f"environment: {name} is not a shardq setting; did you mean {hint}? "
            "(shardq variables are upper case but for worker names and their settings)"
        )
    raise ConfigError(
        f"environment: {name} is not a shardq setting; known: "
        + ", ".join(ENV_PREFIX + k.upper() for k in sorted(_FIELDS) if k != "workers")
    )


def _env_scalar(raw: str) -> Any:
    """Environment values are strings; read numbers and null as YAML would."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if isinstance(value, (int, float)) or value is None else raw


def _coerce(values: dict[str, Any], source: str) -> dict[str, Any]:
    out = dict(values)
    for key in _INTS | _FLOATS:
        if key in out and isinstance(out[key], str):
            try:
                out[key] = int(out[key]) if key in _INTS else float(out[key])
            except ValueError:
                kind = "an integer" if key in _INTS else "a number"
                raise ConfigError(f"{source}: {key}: expected {kind}, got {out[key]!r}") from None
        elif key in _FLOATS and isinstance(out.get(key), int) and not isinstance(out[key], bool):
            out[key] = float(out[key])
        elif key in out and (not isinstance(out[key], (int, float)) or isinstance(out[key], bool)):
            raise ConfigError(f"{source}: {key}: expected a number, got {out[key]!r}")
    for key in ("broker_url", "queue_prefix", "app", "log_format", "log_level", "metrics_host"):
        if key in out and not isinstance(out[key], str):
            raise ConfigError(f"{source}: {key}: expected a string, got {out[key]!r}")
    for key in _OPTIONAL_INTS:
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = int(value)
            except ValueError:
                raise ConfigError(f"{source}: {key}: expected an integer, got {value!r}") from None
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{source}: {key}: expected an integer or null, got {value!r}")
    for key in ("region", "endpoint_url", "store_url", "signing_key", "dashboard_token"):
        if key in out and out[key] is not None and not isinstance(out[key], str):
            raise ConfigError(f"{source}: {key}: expected a string or null, got {out[key]!r}")
    if "workers" in out and out["workers"] is None:
        out["workers"] = {}
    return out
