"""Entity -> shard, which entity ids SQS can carry as a MessageGroupId, and which queue
names are too long for it."""

from __future__ import annotations

import string
from collections import Counter
from typing import Any

import pytest

from shardq.core.errors import InvalidEntityIdError
from shardq.core.limits import MAX_QUEUE_NAME_LENGTH
from shardq.core.topology import check_entity_id, shard_for, too_long

# -- shard_for -----------------------------------------------------------------------

#: Computed once with BLAKE2b-64; a change of hash (or byte order) breaks these, and
#: would move every entity to another shard, reordering jobs in flight during a deploy.
PINNED = [
    ("order-1", 8, 5),
    ("order-1", 1000, 429),
    ("order-1", 2**64, 2709196713320186429),
    ("customer:42", 8, 4),
    ("customer:42", 2**64, 8817378712553089476),
    ("a", 8, 7),
    ("a", 2**64, 4681665781835383343),
    ("Z" * 128, 1000, 35),
    ("!#$%", 1000, 95),
]


@pytest.mark.parametrize(("entity", "shards", "shard"), PINNED)
def test_shard_for_is_pinned_to_known_values(entity: str, shards: int, shard: int) -> None:
    assert shard_for(entity, shards) == shard


def test_shard_for_is_the_same_on_every_call() -> None:
    ids = [f"entity-{i}" for i in range(200)]
    assert [shard_for(e, 16) for e in ids] == [shard_for(e, 16) for e in ids]


def test_shard_for_is_in_range() -> None:
    for shards in (1, 2, 7, 16, 1000):
        assert all(0 <= shard_for(f"e{i}", shards) < shards for i in range(500))


def test_one_shard_takes_every_entity() -> None:
    assert {shard_for(f"e{i}", 1) for i in range(100)} == {0}


@pytest.mark.parametrize("shards", [2, 8, 16, 37])
def test_entities_spread_roughly_evenly_over_shards(shards: int) -> None:
    # given 10,000 sequential entity ids
    counts = Counter(shard_for(f"customer-{i}", shards) for i in range(10_000))
    # then every shard gets within 15 % of its even share
    expected = 10_000 / shards
    assert set(counts) == set(range(shards))
    assert all(abs(n - expected) <= 0.15 * expected for n in counts.values()), counts


def test_similar_ids_land_on_different_shards() -> None:
    # ids differing in one character are not clustered on one shard
    shards = {shard_for(f"order-{c}", 8) for c in string.ascii_lowercase}
    assert len(shards) >= 6


# -- check_entity_id ------------------------------------------------------------------


@pytest.mark.parametrize(
    "entity_id",
    [
        "a",
        "0",
        "order-42",
        "customer:42/eu",
        "x" * 128,
        string.ascii_letters + string.digits,
        string.punctuation,
        "a.b_c~d{e}f[g]h\\i'j\"k`l",
    ],
)
def test_ids_of_letters_digits_and_punctuation_are_accepted(entity_id: str) -> None:
    assert check_entity_id(entity_id) == entity_id


def test_the_empty_id_is_refused() -> None:
    with pytest.raises(InvalidEntityIdError) as caught:
        check_entity_id("")
    assert "has 0 characters; SQS group ids take 1 to 128" in str(caught.value)


def test_an_id_of_129_characters_is_refused_and_shortened_in_the_message() -> None:
    # given an id one character too long
    entity_id = "x" * 129
    # when it is checked
    with pytest.raises(InvalidEntityIdError) as caught:
        check_entity_id(entity_id)
    # then the message gives its length and the limit, without quoting it whole
    message = str(caught.value)
    assert "has 129 characters; SQS group ids take 1 to 128" in message
    assert "x" * 40 + "'..." in message
    assert "x" * 41 not in message


@pytest.mark.parametrize(
    ("entity_id", "bad"),
    [
        ("order 42", " "),
        (" leading", " "),
        ("tab\there", "\t"),
        ("caf\u00e9", "\u00e9"),
        ("\u8ba2\u5355-1", "\u5355\u8ba2"),
        ("emoji-\U0001f600", "\U0001f600"),
        ("nul\x00byte", "\x00"),
        ("bell\x07", "\x07"),
        ("del\x7f", "\x7f"),
        ("trailing-newline\n", "\n"),
        ("line\nbreak", "\n"),
        ("crlf\r\n", "\n\r"),
    ],
)
def test_ids_with_spaces_unicode_or_control_characters_are_refused(
    entity_id: str, bad: str
) -> None:
    # when an id with characters SQS does not take is checked
    with pytest.raises(InvalidEntityIdError) as caught:
        check_entity_id(entity_id)
    # then the message names the offending characters and how to fix the id
    message = str(caught.value)
    assert f"contains {bad!r}" in message
    assert "ASCII letters, digits and punctuation" in message
    assert "hash or urllib.parse.quote" in message


@pytest.mark.parametrize(
    ("entity_id", "type_name"),
    [(42, "int"), (None, "NoneType"), (b"order-1", "bytes"), (4.2, "float"), (["a"], "list")],
)
def test_ids_that_are_not_strings_are_refused(entity_id: Any, type_name: str) -> None:
    with pytest.raises(InvalidEntityIdError) as caught:
        check_entity_id(entity_id)
    message = str(caught.value)
    assert f"is a {type_name}, not a str" in message
    assert "str(your_id)" in message


def test_invalid_entity_id_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        check_entity_id("")


# -- queue names --------------------------------------------------------------------


def test_a_queue_name_over_the_limit_is_named_with_its_length_and_the_limit() -> None:
    # given names of exactly the limit and one character more
    fits, over = "q" * MAX_QUEUE_NAME_LENGTH, "q" * (MAX_QUEUE_NAME_LENGTH + 1)
    # then only the longer one is too long, said with its length and SQS's limit
    assert too_long(fits) is None
    assert too_long(over) == f"{over} (81 characters); SQS allows 80"
