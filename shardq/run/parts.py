"""The parts a node is given from above (:meth:`shardq.App.node` wires them): its
membership in a fleet (and its id there) and its share of a reshard. The run layer
knows only these."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Protocol

from shardq.core.plan import ShardRef


class Membership(Protocol):
    """A node's membership in its fleet (:class:`shardq.fleet.Fleet`)."""

    id: str
    #: True: shards are leased and balanced; False: the node only reports.
    elastic: bool

    def join(self) -> None: ...
    def leave(self) -> None: ...


class Keeper(Protocol):
    """A node's part in a reshard (:class:`shardq.reshard.layout_keeper.LayoutKeeper`)."""

    def route(self, ref: ShardRef, entity: str) -> str: ...
    def start(self) -> None: ...


def make_node_id() -> str:
    """``host-pid-xxxx``: unique in a fleet, readable in logs."""
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())
    return f"{host[:60] or 'node'}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
