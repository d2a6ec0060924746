"""A node's heartbeat: the value of its ``node/<id>`` item in the state store, written by
the node every beat, read tolerantly (another version may have written it) by all."""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any

from shardq.core.fleet_rules import ELASTIC

#: A node's job counts since it started, in all and per worker ("failed": morgued).
COUNTS = ("done", "retried", "failed")


@dataclass(frozen=True)
class Heartbeat:
    """One node's report. Times are Unix seconds of the node's clock (``at``, when it was
    written, is for display only); ``gone`` is why another node marked it gone, else ""."""

    node: str
    host: str = ""
    pid: int = 0
    started: float = 0.0
    at: float = 0.0
    mode: str = ELASTIC
    threads: int = 0
    held: tuple[str, ...] = ()
    lags: Mapping[str, float] = field(default_factory=dict)
    jobs_per_second: float = 0.0
    done: int = 0
    retried: int = 0
    failed: int = 0
    by_worker: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    version: str = ""
    expire: float = 0.0
    concurrency: int | None = None
    slots_in_use: int | None = None  # execution slots busy, out of ``concurrency``
    gone: str = ""
    gone_at: float = 0.0  # by the clock of the node that marked it
    #: The app's queue_prefix: apps sharing a store keep apart fleets (None: not said).
    prefix: str | None = None
    #: The fields the node left out (``lags``, ``held``): its report was over the size limit.
    omitted: tuple[str, ...] = ()

    @property
    def max_lag(self) -> float | None:
        """None when the report left its lags out (unknown, never 0)."""
        return None if "lags" in self.omitted else max(self.lags.values(), default=0.0)

    def to_value(self) -> dict[str, Any]:
        """The value the node writes (the marks of a node gone are another node's)."""
        value = {k: v for k, v in asdict(self).items() if k not in ("gone", "gone_at", "omitted")}
        return {**value, "held": list(self.held)} | (
            {"omitted": list(self.omitted)} if self.omitted else {}
        )

    @classmethod
    def from_value(cls, node: str, v: Mapping[str, Any]) -> Heartbeat:
        """Read a stored value; a missing or malformed field reads as its default."""
        raw = v["lags"] if isinstance(v.get("lags"), dict) else {}
        held = v["held"] if isinstance(v.get("held"), list) else []
        numbers: dict[str, Any] = {k: _opt_int(v.get(k)) or 0 for k in ("pid", "threads", *COUNTS)}
        floats = ("started", "at", "jobs_per_second", "expire", "gone_at")
        numbers.update((k, _float(v.get(k))) for k in floats)
        numbers.update((k, _opt_int(v.get(k))) for k in ("concurrency", "slots_in_use"))
        return cls(
            node=node,
            host=str(v.get("host", "")),
            mode=str(v.get("mode", ELASTIC)),
            held=tuple(str(k) for k in held),
            lags={str(k): x for k, n in raw.items() if (x := _number(n)) is not None},
            by_worker=_worker_counts(v.get("by_worker")),
            version=str(v.get("version", "")),
            gone=str(v.get("gone") or ""),
            prefix=prefix_of(v),
            omitted=tuple(str(k) for k in v["omitted"])
            if isinstance(v.get("omitted"), list)
            else (),
            **numbers,
        )


def prefix_of(value: Mapping[str, Any]) -> str | None:
    """The queue_prefix a stored heartbeat names (None: not said, or not a string)."""
    return value["prefix"] if isinstance(value.get("prefix"), str) else None


def marked_gone(value: Mapping[str, Any], reason: str, at: float, by: str) -> dict[str, Any]:
    """A stored heartbeat ``value`` as node ``by`` marks it gone, at ``at`` by its clock."""
    return {**value, "gone": reason, "gone_at": at, "by": by}


def _worker_counts(value: Any) -> dict[str, dict[str, int]]:
    """A report's ``by_worker``; anything malformed in it counts 0."""
    if not isinstance(value, dict):
        return {}
    return {
        str(w): {k: _opt_int(c.get(k)) or 0 for k in COUNTS}
        for w, c in value.items()
        if isinstance(c, dict)
    }


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A finite number as a float; None for anything else (NaN, an int too large for a float)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with suppress(OverflowError):
            if math.isfinite(number := float(value)):
                return number
    return None


def _float(value: Any) -> float:
    return _number(value) or 0.0
