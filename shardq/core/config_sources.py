"""Where configuration values come from: the YAML file and ``SHARDQ_*`` environment
variables, with text turned into the settings' types (:mod:`shardq.core.config` layers
and validates them).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from shardq.core.errors import ConfigError

ENV_PREFIX = "SHARDQ_"
# the settings of shardq.core.config.Config by type (their text from the environment is read so)
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


def merge_workers(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Per-worker settings of ``overrides`` on top of ``base`` (invalid shapes are kept
    as they are, for validation to report)."""
    merged = {name: dict(settings) for name, settings in base.items()}
    for name, settings in overrides.items():
        if isinstance(settings, Mapping) and isinstance(merged.get(name), dict):
            merged[name].update(settings)
        else:
            merged[name] = settings
    return merged


def read_file(path: Path, known: Collection[str]) -> dict[str, Any]:
    """The settings of the YAML file at ``path``; keys outside ``known`` are refused."""
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
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {', '.join(map(str, unknown))}; known keys: "
            f"{', '.join(sorted(known))}"
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


def from_env(env: Mapping[str, str], known: Collection[str]) -> dict[str, Any]:
    """The ``SHARDQ_*`` settings of ``env`` (names of ``known`` settings, upper case), with
    ``SHARDQ_WORKERS__<Worker>__<key>`` gathered under ``workers``; others are refused."""
    values: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        key = name[len(ENV_PREFIX) :]
        if key.upper().startswith("WORKERS__") and not key.startswith("WORKERS__"):
            parts = key.split("__")
            _unknown_env(name, known, ENV_PREFIX + "__".join(["WORKERS", *parts[1:]]))
        if key.startswith("WORKERS__"):
            parts = key.split("__")
            if len(parts) != 3 or not all(parts):
                raise ConfigError(f"environment: {name}: expected SHARDQ_WORKERS__<Worker>__<key>")
            values.setdefault("workers", {}).setdefault(parts[1], {})[parts[2].lower()] = (
                _env_scalar(raw)
            )
        elif key.lower() in known and key.lower() != "workers" and key == key.upper():
            values[key.lower()] = raw
        elif (key.lower() in known and key.lower() != "workers") or key.upper() == "CONFIG":
            _unknown_env(name, known, ENV_PREFIX + key.upper())
        else:
            _unknown_env(name, known, None)
    return values


def _unknown_env(name: str, known: Collection[str], hint: str | None) -> NoReturn:
    """Refuse ``name``; ``hint``: the variable it was probably meant to be."""
    if hint is not None:
        raise ConfigError(
            f"environment: {name} is not a shardq setting; did you mean {hint}? "
            "(shardq variables are upper case but for worker names and their settings)"
        )
    raise ConfigError(
        f"environment: {name} is not a shardq setting; known: "
        + ", ".join(ENV_PREFIX + k.upper() for k in sorted(known) if k != "workers")
    )


def _env_scalar(raw: str) -> Any:
    """Environment values are strings; read numbers and null as YAML would."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if isinstance(value, (int, float)) or value is None else raw


def coerce(values: dict[str, Any], source: str) -> dict[str, Any]:
    """``values`` with text read as the numbers their settings are; a value of the
    wrong type is refused, naming ``source``."""
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
