"""Where things live, and their names: entity -> shard, a shard's queue, a generation's
name in shard keys. The only place these names are built or parsed (pure functions).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from shardq.core.errors import ConfigError, InvalidEntityIdError
from shardq.core.limits import (
    FIFO_SUFFIX,
    GROUP_ID_PATTERN,
    MAX_GROUP_ID_LENGTH,
    MAX_QUEUE_NAME_LENGTH,
)


def check_entity_id(entity_id: Any) -> str:
    """Return ``entity_id`` if SQS can carry it as a MessageGroupId, else raise."""
    if not isinstance(entity_id, str):
        raise InvalidEntityIdError(
            f"entity id {entity_id!r} is a {type(entity_id).__name__}, not a str; pass str(your_id)"
        )
    if not 1 <= len(entity_id) <= MAX_GROUP_ID_LENGTH:
        raise InvalidEntityIdError(
            f"entity id {entity_id[:40]!r}{'...' if len(entity_id) > 40 else ''} has "
            f"{len(entity_id)} characters; SQS group ids take 1 to {MAX_GROUP_ID_LENGTH}"
        )
    if not GROUP_ID_PATTERN.fullmatch(entity_id):
        bad = sorted({c for c in entity_id if not GROUP_ID_PATTERN.fullmatch(c)})
        raise InvalidEntityIdError(
            f"entity id {entity_id!r} contains {''.join(bad)!r}; SQS group ids take only "
            "ASCII letters, digits and punctuation (no spaces); encode other ids, "
            "e.g. with a hash or urllib.parse.quote"
        )
    return entity_id


def shard_for(entity_id: str, shards: int) -> int:
    """The shard of an entity: a stable 64-bit BLAKE2b hash modulo ``shards``."""
    digest = hashlib.blake2b(entity_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def shard_queue(prefix: str, queue_name: str, shard: int, gen: int = 0) -> str:
    """The queue of shard ``shard`` of layout generation ``gen``: ``{prefix}{queue_name}-3.fifo``
    (generation 0) or ``{prefix}{queue_name}-g2-3.fifo``."""
    part = f"-{shard}" if gen == 0 else f"-g{gen}-{shard}"
    return f"{prefix}{queue_name}{part}{FIFO_SUFFIX}"


def too_long(queue: str) -> str | None:
    """``"<queue> (81 characters); SQS allows 80"`` if SQS would refuse ``queue`` for its
    length, else None."""
    if len(queue) <= MAX_QUEUE_NAME_LENGTH:
        return None
    return f"{queue} ({len(queue)} characters); SQS allows {MAX_QUEUE_NAME_LENGTH}"


def morgue_queue(prefix: str, queue_name: str) -> str:
    """The queue-based morgue of older versions (read only to move it into the store)."""
    return f"{prefix}{queue_name}-morgue{FIFO_SUFFIX}"


def shard_name(worker: str, gen: int) -> str:
    """The name of a generation in shard keys: ``Orders`` (0), ``Orders@2``."""
    return worker if gen == 0 else f"{worker}@{gen}"


def parse_name(name: str) -> tuple[str, int]:
    """``"Orders@2"`` as ``("Orders", 2)``; ``"Orders"`` as ``("Orders", 0)``."""
    worker, at, gen = name.rpartition("@")
    if not at:
        return name, 0
    if not (gen.isascii() and gen.isdigit()) or not worker:
        raise ConfigError(f"{name!r} is not a worker name with a generation (Orders@2)")
    return worker, int(gen)


def shard_key(worker: str, shard: int, gen: int = 0) -> str:
    """``"Orders:3"`` (generation 0), ``"Orders@2:3"`` (generation 2)."""
    return f"{shard_name(worker, gen)}:{shard}"


def shard_keys(shards: Mapping[str, int]) -> list[str]:
    """``name:n`` of every shard (``shards``: generation name -> count), sorted."""
    return [f"{name}:{n}" for name in sorted(shards) for n in range(shards[name])]


def parse_key(key: str) -> tuple[str, int]:
    """``"Orders@2:3"`` as ``("Orders@2", 3)``; ValueError naming a damaged key."""
    name, _, number = key.rpartition(":")
    if not name or not (number.isascii() and number.isdigit()) or number != str(int(number)):
        raise ValueError(f"shard key {key!r} is not 'name:shard', e.g. 'Orders:3'")
    return name, int(number)
