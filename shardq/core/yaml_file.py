"""Reading a YAML file strictly: UTF-8, and no mapping naming a key twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shardq.core.errors import ConfigError


def read_yaml(path: Path) -> Any:
    """The document of the YAML file at ``path``; ConfigError naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"cannot read config file {path}: byte {exc.start} is not UTF-8; save it as UTF-8"
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of 4,300+ digits
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc


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
                if key in seen:  # also on one line ({a: 1, a: 2}) or by an alias
                    raise _DuplicateKey(
                        f"duplicate key {key!r} on line {line} (first on line {seen[key]}); "
                        "keep one of them"
                    )
            except TypeError:  # an unhashable key: PyYAML reports it below
                continue
            seen[key] = line
        return super().construct_mapping(node, deep=deep)
