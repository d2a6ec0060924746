"""Configuration: defaults < ``shardq.yaml`` < ``SHARDQ_*`` environment < CLI flags
(every key and its environment variable: README, "Configuration"). AWS credentials are
never read from here: boto3's default chain provides them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

import yaml

from shardq.core.errors import ConfigError
from shardq.core.jobs import int_in
from shardq.core.limits import (
    MAX_CONCURRENCY,
    MAX_THREADS,
    MAX_WAIT_SECONDS,
    QUEUE_NAME_PATTERN,
    REGION_PATTERN,
)
from shardq.core.yaml_file import read_yaml

DEFAULT_FILE = "shardq.yaml"
ENV_PREFIX = "SHARDQ_"
#: Defaults of ``connect_timeout`` and ``read_timeout``: seconds an AWS call's attempt
#: gets to connect, and to be answered (long polls excepted).
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 6.0
#: The longest ``connect_timeout`` or ``read_timeout``: a call held longer holds a thread.
MAX_TIMEOUT = 300.0
_CHOICES = {
    "log_format": ("auto", "console", "json"),
    "log_level": ("debug", "info", "warning", "error"),
}


@dataclass(frozen=True)
class Config:
    """Everything a publisher or node needs besides the worker classes; each key is
    described in README, "Configuration"."""

    broker_url: str = "sqlite:///shardq.db"
    region: str | None = None
    endpoint_url: str | None = None
    store_url: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    queue_prefix: str = ""
    app: str = "workers"
    threads: int = 4
    concurrency: int = 32
    grace_seconds: float = 30.0
    idle_wait_seconds: float = 20.0
    prefetch: int = 2
    progress_seconds: float = 10.0
    lease_seconds: float = 30.0
    #: Unused since the fleet lives in the state store (still accepted).
    report_seconds: float = 45.0
    layout_refresh_seconds: float = 10.0
    reshard_trust_seconds: float = 60.0
    retention_warning_share: float = 0.5
    signing_key: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    morgue_retention_days: int | None = None
    dashboard_token: str | None = None
    log_format: str = "auto"
    log_level: str = "info"
    workers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Where the values came from, for error messages.
    source: str = "defaults"

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
        layers: list[tuple[str, dict[str, Any]]] = []
        if base is not None:
            layers.append(("the app's config", {key: getattr(base, key) for key in _FIELDS}))
        file_path = env.get(ENV_PREFIX + "CONFIG") if path is None else path
        if file_path is not None and not os.fspath(file_path).strip():  # "$CONFIG" unset
            raise ConfigError(
                f"the config file path (--config or ${ENV_PREFIX}CONFIG) is empty: name a "
                f"file, or leave it out to read ./{DEFAULT_FILE} if present"
            )
        if file_path is None and Path(DEFAULT_FILE).is_file():
            file_path = DEFAULT_FILE
        if file_path:
            layers.append((str(file_path), _read_file(Path(file_path))))
        if env_values := _from_env(env):
            layers.append(("environment", env_values))
        for key, value in (overrides or {}).items():
            if value is not None:
                layers.append((f"--{key.replace('_', '-')}", {key: value}))
        values: dict[str, Any] = {"workers": {}}
        for _, layer in layers:
            workers = {name: dict(s) for name, s in values["workers"].items()}
            for name, settings in (layer.pop("workers", None) or {}).items():
                workers.setdefault(name, {}).update(settings)
            values.update(layer, workers=workers)
        values["source"] = " + ".join(dict.fromkeys(s for s, _ in layers)) or "defaults"
        return cls(**_coerce(values, values["source"]))

    def with_overrides(self, **changes: Any) -> Config:
        """A copy with some values replaced (None values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def __post_init__(self) -> None:
        where = self.source

        def fail(key: str, problem: str) -> None:
            raise ConfigError(f"{where}: {key}: {problem}")

        for key in ("connect_timeout", "read_timeout"):
            if problem := timeout_problem(getattr(self, key)):
                fail(key, problem)
        for key, kind in _TYPES.items():  # as ``load`` checks them, for a Config made in code
            if expected := _expected(kind, getattr(self, key)):
                fail(key, f"expected {expected}, got {getattr(self, key)!r}")
        for key, high in _INT_MAX.items():
            if problem := int_in(1, high)(getattr(self, key)):
                fail(key, problem)
        for key, (low, high) in _RANGES.items():
            if not low <= getattr(self, key) <= high:
                fail(key, f"expected {low:g} to {high:g}, got {getattr(self, key)!r}")
        if not 0 < self.idle_wait_seconds <= MAX_WAIT_SECONDS:
            fail("idle_wait_seconds", f"expected more than 0 and at most {MAX_WAIT_SECONDS}")
        secret = self.signing_key  # "": a secret that did not load (signing would be off)
        if secret is not None and (not secret or any("\ud800" <= c <= "\udfff" for c in secret)):
            fail("signing_key", "expected a non-empty string (the shared secret) or null")
        days = self.morgue_retention_days
        if days is not None and (type(days) is not int or not 1 <= days <= 36500):
            fail("morgue_retention_days", f"expected whole days from 1 to 36500, got {days!r}")
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
        for key, choices in _CHOICES.items():
            if getattr(self, key) not in choices:
                fail(key, f"expected one of {', '.join(choices)}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            fail("metrics_port", f"expected a port from 0 to 65535, got {self.metrics_port!r}")
        if "://" not in self.broker_url:
            fail(
                "broker_url", f"expected a URL such as sqlite:///shardq.db, got {self.broker_url!r}"
            )
        if self.region is not None and (problem := region_problem(self.region)):
            fail("region", problem)
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
            store_parameters(self.store_url, where)
        if not 0 <= self.retention_warning_share <= 1:
            fail(
                "retention_warning_share",
                f"expected 0 (off) to 1, got {self.retention_warning_share!r}",
            )
        if not isinstance(self.workers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Mapping) for k, v in self.workers.items()
        ):
            fail("workers", "expected a mapping of worker name to a mapping of settings")


_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "source"}
#: Each setting's type as written (``int``, ``str | None``...): how its text is read.
_TYPES = {name: str(f.type) for name, f in _FIELDS.items()}
#: Settings that take an integer from 1 to a maximum, and any number in a range.
_INT_MAX = {"threads": MAX_THREADS, "concurrency": MAX_CONCURRENCY, "prefetch": 10}
_RANGES = {
    "grace_seconds": (0, 3600),
    "progress_seconds": (0, 86400),
    "lease_seconds": (10, 600),
    "report_seconds": (5, 45),
    "layout_refresh_seconds": (0.1, 60),
    "reshard_trust_seconds": (5, 3600),
}


STORE_URL_PARAMETERS = ("region", "endpoint_url", "table")


def url_parameters(what: str, url: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters of ``url`` (the last of a repeated one); one outside
    ``allowed`` raises ConfigError naming ``what`` (``broker_url``)."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if unknown := sorted(set(query) - set(allowed)):
        raise ConfigError(
            f"{what} {url!r} has unknown parameter(s) {', '.join(unknown)}; "
            f"{parts.scheme}:// URLs take {', '.join(allowed)}"
        )
    return query


def store_parameters(url: str, where: str = "config") -> dict[str, str]:
    """The parameters of ``store_url`` (``dynamodb://?region=..&endpoint_url=..&table=..``);
    another scheme or an unknown parameter raises ConfigError."""
    parts = urlsplit(url)
    if parts.scheme != "dynamodb" or parts.netloc or parts.path:
        raise ConfigError(
            f"{where}: store_url: {url!r} is not supported; use "
            "dynamodb://?region=..&endpoint_url=..&table=.. (each optional), or leave "
            "store_url unset for the broker's own store"
        )
    query = url_parameters(f"{where}: store_url", url, STORE_URL_PARAMETERS)
    if empty := sorted(k for k, v in query.items() if not v):
        raise ConfigError(f"{where}: store_url {url!r}: {', '.join(empty)} is empty")
    if "region" in query and (problem := region_problem(query["region"])):
        raise ConfigError(f"{where}: store_url {url!r}: region: {problem}")
    return query


def region_problem(region: str) -> str | None:
    """What is wrong with ``region`` as an AWS region's name, or None."""
    if REGION_PATTERN.fullmatch(region):
        return None
    return f"expected an AWS region such as us-east-1, got {region!r}"


def timeout_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a timeout (seconds above 0, at most
    :data:`MAX_TIMEOUT`), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected seconds above 0 (a finite number), got {value!r}"
    if not 0 < value <= MAX_TIMEOUT:  # NaN too
        limit = f"above 0 and at most {MAX_TIMEOUT:g}"
        return f"expected seconds {limit} (a finite number), got {value!r}"
    return None


def check_timeouts(owner: str, connect: float, read: float) -> None:
    """ValueError naming ``owner`` and the argument if either timeout is not valid."""
    for name, value in (("connect_timeout", connect), ("read_timeout", read)):
        if problem := timeout_problem(value):
            raise ValueError(f"{owner} {name}: {problem}")


def _read_file(path: Path) -> dict[str, Any]:
    """The settings of the YAML file at ``path``; unknown keys are refused."""
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    if unknown := sorted(set(data) - set(_FIELDS)):
        raise ConfigError(
            f"{path}: unknown key {', '.join(map(str, unknown))}; known keys: "
            f"{', '.join(sorted(_FIELDS))}"
        )
    workers = data.get("workers") or {}
    if not isinstance(workers, Mapping) or not all(
        isinstance(v, Mapping) for v in workers.values()
    ):
        raise ConfigError(
            f"{path}: workers: expected a mapping of worker name to a mapping of settings"
        )
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``SHARDQ_*`` settings of ``env`` (setting names in upper case), with
    ``SHARDQ_WORKERS__<Worker>__<key>`` gathered under ``workers``; others are refused."""
    values: dict[str, Any] = {}
    for name, raw in env.items():
        key = name[len(ENV_PREFIX) :]
        if not name.startswith(ENV_PREFIX) or key == "CONFIG":
            continue
        head, sep, rest = key.partition("__")
        if head.upper() == "WORKERS" and sep:
            if head != "WORKERS":
                _unknown_env(name, f"{ENV_PREFIX}WORKERS__{rest}")
            parts = rest.split("__")
            if len(parts) != 2 or not all(parts):
                raise ConfigError(f"environment: {name}: expected SHARDQ_WORKERS__<Worker>__<key>")
            worker = values.setdefault("workers", {}).setdefault(parts[0], {})
            setting = parts[1].lower()  # a queue name is text, even "2024"
            worker[setting] = raw if setting == "queue_name" else _env_scalar(raw)
        elif key.lower() in _FIELDS and key.lower() != "workers":
            if key != key.upper():
                _unknown_env(name, ENV_PREFIX + key.upper())
            nullable = _TYPES[key.lower()].endswith("| None")  # null: unset, as in a file
            values[key.lower()] = None if nullable and raw == "null" else raw
        else:
            _unknown_env(name, ENV_PREFIX + "CONFIG" if key.upper() == "CONFIG" else None)
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
    """Environment values are strings; read null and numbers as YAML would, and as the
    top-level keys are read (``1e3`` too, which YAML leaves as text)."""
    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, ValueError):  # ValueError: an integer of 4,300+ digits
        value = raw
    if isinstance(value, (int, float)) or value is None:
        return value
    with contextlib.suppress(ValueError):
        return float(raw)
    return raw


def _coerce(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with text read as the numbers their settings are (by each setting's
    annotation); a value of the wrong type is refused, naming ``source``."""
    out = dict(values)
    for key, value in values.items():
        kind = _TYPES.get(key)
        expected = None
        if kind in ("int", "float", "int | None") and isinstance(value, str):
            try:
                out[key] = float(value) if kind == "float" else int(value)
            except ValueError:
                expected = "a number" if kind == "float" else "an integer"
        else:
            expected = _expected(kind, value)
            if expected is None and kind == "float":
                out[key] = float(value)
        if expected:
            raise ConfigError(f"{source}: {key}: expected {expected}, got {value!r}")
    return out


def _expected(kind: str | None, value: Any) -> str | None:
    """What a setting of type ``kind`` (as written) expects, if ``value`` is not of it."""
    if kind == "int | None":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return "an integer or null"
    elif kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "a number"
    elif kind == "str" and not isinstance(value, str):
        return "a string"
    elif kind == "str | None" and value is not None and not isinstance(value, str):
        return "a string or null"
    return None
