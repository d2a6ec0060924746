"""The elastic fleet: leases, presence, balance and handover between real nodes."""

from __future__ import annotations

import pytest

from shardq.fleet import BOUNCE_GIVE_UP_SECONDS, take_lease
from shardq.fleet_doc import FleetDoc

DOC = FleetDoc(targets={"W:0": "a", "W:1": "b"})


@pytest.mark.parametrize(
    ("key", "me", "live", "bounced_for", "takes"),
    [
        ("W:0", "a", {"a", "b"}, None, True),  # targeted here
        ("W:1", "a", {"a", "b"}, None, False),  # targeted at a live node: its turn
        ("W:1", "a", {"a"}, None, True),  # its target is not live
        ("W:9", "a", {"a", "b"}, None, True),  # no target yet (a new shard)
        ("W:1", "a", {"a", "b"}, 1.0, False),  # came back once: still the target's
        ("W:1", "a", {"a", "b"}, BOUNCE_GIVE_UP_SECONDS, True),  # target not taking it
    ],
)
def test_take_lease_decides_from_the_target_and_how_long_it_bounced(
    key: str, me: str, live: set[str], bounced_for: float | None, takes: bool
) -> None:
    assert take_lease(key, me, DOC, live, bounced_for) is takes
