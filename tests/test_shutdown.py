"""What a stopping node hands back, on plain data."""

from __future__ import annotations

from shardq.broker.base import Message
from shardq.run.shutdown import hand_back


def message(receipt: str, entity: str, sequence: str) -> Message:
    return Message("q", receipt, receipt, "{}", entity, 1, 0.0, sequence)


def test_a_stopping_node_hides_retries_then_what_is_behind_them_then_releases_the_rest() -> None:
    # given a held retry of entity a due in 4 s, a's later job b2, job c1 of entity c
    # not started, and job r1 of entity r still running with its later job r2
    a1, a2 = message("a1", "a", "1"), message("a2", "a", "3")
    c1, r1, r2 = message("c1", "c", "2"), message("r1", "r", "4"), message("r2", "r", "5")
    held = [r2, c1, a2, a1, r1]
    # when the node hands back what it holds, at time 10
    out = hand_back(held, {"r1", "r2"}, [(14.0, [a1])], now=10.0)
    # then the retry is hidden first for what is left of its delay, a's later job as
    # long, c's job released at once; nothing of the running entity is touched
    assert [([m.receipt for m in ms], s) for ms, s in out] == [
        (["a1"], 4.0),
        (["a2"], 4.0),
        (["c1"], 0.0),
    ]
