"""Where things live: entity -> shard, and shards -> nodes -> threads.

Both are pure functions, identical in every process and Python version.
"""

from __future__ import annotations

import hashlib
from typing import Any

from shardq.core.errors import InvalidEntityIdError
from shardq.core.limits import GROUP_ID_PATTERN, MAX_GROUP_ID_LENGTH


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
