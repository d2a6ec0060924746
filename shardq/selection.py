"""Which dead jobs a requeue or purge acts on, said the same way by the JSON API and
the ``shardq morgue`` options: an entity, message ids, both, or all of them, and
"all" only when said explicitly. Anything else is refused before a job is touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardq.app import App
from shardq.errors import ShardqError
from shardq.morgue import MorgueQueue, MorgueRecord

BODY_FORMS = '{"message_ids": [...]}, {"entity": "..."}, both, or {"all": true}'
ARG_FORMS = "--entity ID, --id MESSAGE_ID (repeatable), both, or --all"


class SelectionError(ShardqError, ValueError):
    """A requeue or purge does not say exactly which dead jobs: nothing was changed."""


@dataclass(frozen=True)
class Selection:
    """The dead jobs a requeue or purge acts on: those of ``entity`` and/or with one of
    ``message_ids``, or every one (``everything``). "Every one" is only ever said
    explicitly: no selection, an unknown key or a contradiction is refused."""

    entity: str | None = None
    message_ids: tuple[str, ...] | None = None
    everything: bool = False

    @classmethod
    def from_body(cls, doc: Any) -> Selection:
        """From a JSON API body such as ``{"entity": "order-42"}`` or ``{"all": true}``."""
        if not isinstance(doc, dict):
            raise SelectionError(f"the request body must be a JSON object: {BODY_FORMS}")
        unknown = sorted(set(doc) - {"all", "entity", "message_ids"})
        if unknown:
            raise SelectionError(
                f"unknown key {', '.join(map(repr, unknown))}: nothing was changed; "
                f"send {BODY_FORMS}"
            )
        if "all" in doc and doc["all"] is not True:
            raise SelectionError(f'"all" must be true, got {json.dumps(doc["all"])[:40]}')
        return cls._checked(doc.get("entity"), doc.get("message_ids"), "all" in doc, BODY_FORMS)

    @classmethod
    def from_args(cls, entity: str | None, ids: list[str] | None, everything: bool) -> Selection:
        """From the ``--entity``, ``--id`` and ``--all`` options of ``shardq morgue``."""
        return cls._checked(entity, ids, everything, ARG_FORMS)

    @classmethod
    def _checked(cls, entity: Any, ids: Any, everything: bool, forms: str) -> Selection:
        if entity is not None and not (isinstance(entity, str) and entity):
            raise SelectionError("entity must be a non-empty string")
        if ids is not None and not (
            isinstance(ids, list) and all(isinstance(i, str) and i for i in ids)
        ):
            raise SelectionError("message_ids must be a list of non-empty strings")
        if everything and (entity is not None or ids is not None):
            raise SelectionError(
                "all means every dead job: give it alone, not with an entity or ids"
            )
        if not everything and entity is None and ids is None:
            raise SelectionError(f"say which dead jobs: {forms}; nothing was changed")
        return cls(entity, None if ids is None else tuple(ids), everything)

    @property
    def empty(self) -> bool:
        """True if it names no job at all (an empty list of ids)."""
        return self.message_ids == ()

    def describe(self, worker: str) -> str:
        """``dead SyncOrder jobs of entity order-42``, ``dead SyncOrder jobs (all of them)``."""
        return f"dead {worker} jobs{self.scope()}"

    def scope(self) -> str:
        """`` of entity order-42``, `` with ids a, b`` or `` (all of them)``."""
        if self.everything:
            return " (all of them)"
        parts = [
            f" of entity {self.entity}" if self.entity else "",
            f" with ids {', '.join(self.message_ids)}" if self.message_ids else "",
        ]
        return "".join(parts)


def act(
    app: App,
    worker: str,
    action: str,
    selection: Selection,
    progress: Callable[[int], None] | None = None,
    refused: Callable[[MorgueRecord, str], None] | None = None,
) -> int:
    """Requeue or purge (``action``) the selected dead jobs of ``worker``; how many.
    ``refused`` hears of each dead job that cannot be requeued (it stays)."""
    if selection.empty:
        return 0
    morgue = MorgueQueue(app, worker)
    if action == "requeue":
        return morgue.requeue(selection.entity, selection.message_ids, progress, refused)
    return morgue.purge(selection.entity, selection.message_ids, progress)
