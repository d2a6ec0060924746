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
    workers = data.get("workers") or {}
    if not isinstance(workers, Mapping) or not all(
        isinstance(v, Mapping) for v in workers.values()
    ):
        raise ConfigError(
            f"{path}: workers: expected a mapping of worker name to a mapping of settings"
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
        key = name[len(ENV_PREFIX) :]
        if not name.startswith(ENV_PREFIX) or key == "CONFIG":
            continue
        head, sep, rest = key.partition("__")
        if head.upper() == "WORKERS" and sep:
            if head != "WORKERS":
                _unknown_env(name, known, f"{ENV_PREFIX}WORKERS__{rest}")
            parts = rest.split("__")
            if len(parts) != 2 or not all(parts):
                raise ConfigError(f"environment: {name}: expected SHARDQ_WORKERS__<Worker>__<key>")
            worker = values.setdefault("workers", {}).setdefault(parts[0], {})
            worker[parts[1].lower()] = _env_scalar(raw)
        elif key.lower() in known and key.lower() != "workers":
            if key != key.upper():
                _unknown_env(name, known, ENV_PREFIX + key.upper())
            values[key.lower()] = raw
        else:
            _unknown_env(name, known, ENV_PREFIX + "CONFIG" if key.upper() == "CONFIG" else None)
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


def coerce(values: dict[str, Any], source: str, types: Mapping[str, str]) -> dict[str, Any]:
    """``values`` with text read as the numbers their settings are (``types``: each
    setting's annotation); a value of the wrong type is refused, naming ``source``."""
    out = dict(values)
    for key, value in values.items():
        kind = types.get(key)
        expected = None
        if kind in ("int", "float", "int | None") and isinstance(value, str):
            try:
                out[key] = float(value) if kind == "float" else int(value)
            except ValueError:
                expected = "a number" if kind == "float" else "an integer"
        elif kind == "int | None":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                expected = "an integer or null"
        elif kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                expected = "a number"
            elif kind == "float":
                out[key] = float(value)
        elif kind == "str" and not isinstance(value, str):
            expected = "a string"
        elif kind == "str | None" and value is not None and not isinstance(value, str):
            expected = "a string or null"
        if expected:
            raise ConfigError(f"{source}: {key}: expected {expected}, got {value!r}")
    return out
