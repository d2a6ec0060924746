"""The wire format: a versioned JSON envelope, optionally HMAC-signed."""

from __future__ import annotations

import json
import math
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core.envelope import VERSION, Envelope, decode, encode
from shardq.core.errors import EnvelopeError, PayloadError

KEY = b"shared-secret"
SENT_AT = 1_700_000_000.5
#: Leave a field out of a body made by ``body_of``.
_DROP = object()


def sample(payload: Any = None, **changes: Any) -> Envelope:
    values: dict[str, Any] = {
        "worker": "SyncOrder",
        "entity": "order-42",
        "payload": {"id": 42, "items": ["a", "b"]} if payload is None else payload,
        "published_at": SENT_AT,
        "meta": {"trace": "abc"},
    }
    values.update(changes)
    return Envelope(**values)


def body_of(**doc: Any) -> str:
    base: dict[str, Any] = {
        "v": VERSION,
        "worker": "SyncOrder",
        "entity": "order-42",
        "payload": 1,
        "published_at": SENT_AT,
        "meta": {},
    }
    base.update(doc)
    return json.dumps({k: v for k, v in base.items() if v is not _DROP})


# -- round trips -------------------------------------------------------------------


def test_an_envelope_survives_a_round_trip() -> None:
    # given an envelope
    original = sample()
    # when it is encoded and decoded
    decoded = decode(encode(original))
    # then every field is back
    assert decoded == original


def test_the_body_is_compact_versioned_json() -> None:
    # when an envelope is encoded
    body = encode(sample(payload={"k": "v"}))
    # then it is compact JSON with the version and every field
    assert " " not in body
    assert json.loads(body) == {
        "v": 1,
        "worker": "SyncOrder",
        "entity": "order-42",
        "payload": {"k": "v"},
        "published_at": SENT_AT,
        "meta": {"trace": "abc"},
    }


def test_non_ascii_text_is_kept_as_is() -> None:
    original = sample(payload={"name": "Zo\u00eb \u2603 \U0001f600"})
    body = encode(original)
    assert "Zo\u00eb \u2603 \U0001f600" in body
    assert decode(body) == original


def sqs_allows(body: str) -> bool:
    """True if SQS accepts every character of ``body`` (its documented set: tab, LF,
    CR, U+0020-U+D7FF, U+E000-U+FFFD, U+10000-U+10FFFF)."""
    return all(
        c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c >= "\U00010000"
        for c in body
    )


def test_text_with_characters_sqs_refuses_is_escaped_and_round_trips() -> None:
    # given text with the two noncharacters SQS refuses in a body, in payload and meta
    original = sample(payload={"name": "a\uffffb\ufffe"}, meta={"\uffff": "x"})
    # when it is encoded / then the body carries them as JSON escapes, and they come back
    body = encode(original)
    assert sqs_allows(body) and "\\uffff" in body
    assert decode(body) == original


def test_published_at_defaults_to_now_and_keeps_microseconds() -> None:
    # given an envelope with a precise timestamp
    original = sample(published_at=1_700_000_000.123456)
    # then it comes back to the microsecond
    assert decode(encode(original)).published_at == pytest.approx(1_700_000_000.123456, abs=1e-6)
    # and an envelope without one is stamped with the current time
    assert Envelope("W", "e", None).published_at > 1_600_000_000


def test_a_missing_meta_decodes_as_empty() -> None:
    assert decode(body_of(meta=_DROP)).meta == {}


@pytest.mark.parametrize("payload", [None, 0, -1.5, "", "text", [], {}, [1, [2, [3]]], True])
def test_any_json_value_is_a_payload(payload: Any) -> None:
    original = Envelope("W", "e", payload, SENT_AT, {})
    assert decode(encode(original)).payload == payload


# -- payloads that cannot be published ------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"when": date(2024, 1, 1)},
        Decimal("1.10"),
        {1, 2},
        object(),
        b"bytes",
        {("tuple", "key"): 1},
    ],
)
def test_a_payload_that_is_not_json_is_refused_naming_the_entity(payload: Any) -> None:
    # when an envelope with a non-JSON payload is encoded
    with pytest.raises(PayloadError) as caught:
        encode(sample(payload=payload, entity="cust-7"))
    # then the error names the entity and the worker and says what to pass
    message = str(caught.value)
    assert "entity 'cust-7'" in message
    assert "worker SyncOrder" in message
    assert "not JSON-serialisable" in message


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(number: float) -> None:
    with pytest.raises(PayloadError, match="entity 'order-42'"):
        encode(sample(payload={"x": [number]}))


@pytest.mark.parametrize(
    ("payload", "meta", "where"),
    [
        ({1: "a", "1": "b"}, {}, "payload has the key 1 (int)"),
        ({"items": [{"sku": "A"}, {2.5: "x"}]}, {}, "payload['items'][1] has the key 2.5 (float)"),
        ([{"a": {True: 1}}], {}, "payload[0]['a'] has the key True (bool)"),
        ({"n": {None: 1}}, {}, "payload['n'] has the key None (NoneType)"),
        ({"ok": 1}, {"retry": {3: "x"}}, "meta['retry'] has the key 3 (int)"),
    ],
)
def test_a_key_that_is_not_a_string_is_refused_naming_its_path(
    payload: Any, meta: dict[str, Any], where: str
) -> None:
    # given a payload or meta with a dict key JSON would turn into a string ({1: "a",
    # "1": "b"} would arrive as {"1": "b"}: "a" lost)
    # when it is encoded, then it is refused naming the entity, the path and the key
    with pytest.raises(PayloadError) as caught:
        encode(sample(payload=payload, meta=meta, entity="cust-7"))
    message = str(caught.value)
    assert "entity 'cust-7'" in message and where in message
    assert "keys must be strings" in message


def test_a_body_published_with_such_keys_still_decodes() -> None:
    # given bodies earlier versions sent for {1: "a", "1": "b"} and for {1: "a"}
    for text, payload in [('{"1":"a","1":"b"}', {"1": "b"}), ('{"1":"a"}', {"1": "a"})]:
        body = f'{{"v":1,"worker":"W","entity":"e","payload":{text},"published_at":1.0}}'
        # when a node decodes them, then they decode as they did (the last value wins)
        assert decode(body).payload == payload


def test_non_json_meta_is_refused_too() -> None:
    with pytest.raises(PayloadError):
        encode(sample(meta={"at": date(2024, 1, 1)}))


def test_payload_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        encode(sample(payload=object()))


# -- signing -------------------------------------------------------------------------


def test_a_signed_envelope_survives_a_round_trip() -> None:
    original = sample()
    body = encode(original, KEY)
    assert body.startswith("sig1:")
    assert decode(body, KEY) == original


def test_the_signature_is_an_hmac_sha256_of_the_json() -> None:
    import hashlib
    import hmac

    # when an envelope is signed
    body = encode(sample(), KEY)
    # then the body is sig1:<hex>:<json> where hex signs the json
    _, signature, text = body.split(":", 2)
    assert signature == hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()
    assert text == encode(sample())


def test_a_signature_in_upper_case_hex_is_accepted() -> None:
    # given a body a producer signed with upper-case hex (Java's and .NET's hex helpers)
    _, signature, text = encode(sample(), KEY).split(":", 2)
    # when a node decodes it, then the signature matches
    assert decode(f"sig1:{signature.upper()}:{text}", KEY) == decode(
        f"sig1:{signature}:{text}", KEY
    )


def test_a_tampered_payload_is_refused() -> None:
    # given a signed body whose JSON was changed after signing
    body = encode(sample(payload={"amount": 10}), KEY)
    tampered = body.replace('"amount":10', '"amount":99')
    assert tampered != body
    # then it is refused
    with pytest.raises(EnvelopeError, match="signature does not match"):
        decode(tampered, KEY)


def test_a_tampered_signature_is_refused() -> None:
    # given a signed body with one hex digit of its signature changed
    body = encode(sample(), KEY)
    digit = body[5]
    tampered = body[:5] + ("0" if digit != "0" else "1") + body[6:]
    # then it is refused
    with pytest.raises(EnvelopeError, match="signature does not match"):
        decode(tampered, KEY)


@pytest.mark.parametrize("signature", ["", "zz", "\u00e9" * 64, "sig"])
def test_a_malformed_signature_is_refused(signature: str) -> None:
    text = encode(sample())
    with pytest.raises(EnvelopeError, match="signature does not match"):
        decode(f"sig1:{signature}:{text}", KEY)


def test_a_signed_body_without_separator_is_refused() -> None:
    with pytest.raises(EnvelopeError, match="signature does not match"):
        decode("sig1:abcdef", KEY)


def test_a_body_signed_with_another_key_is_refused() -> None:
    body = encode(sample(), b"other-key")
    with pytest.raises(EnvelopeError, match="signature does not match"):
        decode(body, KEY)


def test_an_unsigned_body_is_refused_when_a_key_is_configured() -> None:
    body = encode(sample())
    with pytest.raises(EnvelopeError, match="not signed but a signing key is configured"):
        decode(body, KEY)


def test_a_signed_body_is_refused_without_a_key() -> None:
    body = encode(sample(), KEY)
    with pytest.raises(EnvelopeError, match="signed but no signing key is configured"):
        decode(body)


# -- bodies that are not envelopes ------------------------------------------------------


def test_a_future_version_is_refused_with_a_clear_message() -> None:
    # given a body written by a newer shardq
    body = body_of(v=2)
    # when it is decoded
    with pytest.raises(EnvelopeError) as caught:
        decode(body)
    # then the error names both versions and what to do
    message = str(caught.value)
    assert "envelope version 2 is not supported" in message
    assert "expects 1" in message
    assert "upgrade" in message


def test_a_missing_version_is_refused() -> None:
    with pytest.raises(EnvelopeError, match=r'no "v".*not a shardq envelope'):
        decode(body_of(v=_DROP))


@pytest.mark.parametrize("body", ['{"a": 1}', "{}", "hello", "[1]", '"text"'])
def test_a_body_that_is_not_an_envelope_says_so(body: str) -> None:
    # given a body some other producer wrote, when it is decoded
    with pytest.raises(EnvelopeError) as caught:
        decode(body)
    # then the error says it is not a shardq envelope, and nothing about upgrading
    assert "not a shardq envelope" in str(caught.value)
    assert "docs/envelope.md" in str(caught.value)
    assert "upgrade" not in str(caught.value)


@pytest.mark.parametrize("body", ["", "not json", "{", '{"v": 1,}', "\x00"])
def test_malformed_json_is_refused(body: str) -> None:
    with pytest.raises(EnvelopeError, match="message body is not JSON"):
        decode(body)


@pytest.mark.parametrize("body", ["[]", "1", '"text"', "null", "[1, 2]"])
def test_a_json_value_that_is_not_an_object_is_refused(body: str) -> None:
    with pytest.raises(EnvelopeError, match="message body is not a JSON object"):
        decode(body)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"worker": _DROP}, "no worker name"),
        ({"worker": ""}, "no worker name"),
        ({"worker": 3}, "no worker name"),
        ({"entity": _DROP}, "no entity id"),
        ({"entity": ""}, "no entity id"),
        ({"entity": None}, "no entity id"),
        ({"published_at": _DROP}, "no numeric published_at"),
        ({"published_at": "2024-01-01"}, "no numeric published_at"),
        ({"published_at": True}, "no numeric published_at"),
        ({"meta": []}, "meta is not an object"),
        ({"meta": "x"}, "meta is not an object"),
        ({"payload": _DROP}, "no payload"),
    ],
)
def test_missing_or_wrong_fields_are_refused(doc: dict[str, Any], problem: str) -> None:
    with pytest.raises(EnvelopeError, match=problem):
        decode(body_of(**doc))


def test_an_integer_published_at_decodes_as_a_float() -> None:
    decoded = decode(body_of(published_at=1_700_000_000))
    assert decoded.published_at == 1_700_000_000.0
    assert isinstance(decoded.published_at, float)


def test_a_null_payload_is_a_payload() -> None:
    assert decode(body_of(payload=None)).payload is None


def test_envelope_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode("nope")


# -- property: any JSON payload round-trips ----------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None)
@given(
    payload=json_values,
    meta=st.dictionaries(st.text(), json_values, max_size=3),
    signed=st.booleans(),
)
def test_any_json_payload_round_trips(payload: Any, meta: dict[str, Any], signed: bool) -> None:
    # given an envelope with an arbitrary JSON payload and meta
    original = Envelope("SyncOrder", "order-1", payload, SENT_AT, meta)
    key = KEY if signed else None
    # when it is encoded and decoded (signed or not)
    body = encode(original, key)
    decoded = decode(body, key)
    # then it is equal to the original, and SQS can carry the body
    assert decoded == original
    assert sqs_allows(body)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_body_with_nan_or_infinity_is_refused_as_encoding_refuses_it(constant: str) -> None:
    # given a body someone wrote by hand with a number JSON does not have
    body = encode(sample({"n": 1})).replace('{"n":1}', f'{{"n":{constant}}}')
    assert constant in body
    # when it is decoded, then it is not a valid envelope
    with pytest.raises(EnvelopeError, match=f"{constant} is not a JSON number"):
        decode(body)


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1.5e400"])
def test_a_number_too_large_for_a_float_is_refused(number: str) -> None:
    # given a body whose number is valid JSON text but reads as infinity
    body = encode(sample({"n": 1})).replace('{"n":1}', f'{{"n":{number}}}')
    # when it is decoded, then it is refused as encoding would refuse infinity, saying
    # what it is (valid JSON and an envelope, but not a double)
    with pytest.raises(EnvelopeError) as refused:
        decode(body)
    assert str(refused.value) == f"the envelope holds a number too large for a double ({number})"


def test_a_payload_nested_too_deeply_is_a_payload_error() -> None:
    deep: Any = []
    for _ in range(1500):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested too deeply"):
        encode(sample(deep))


def test_a_payload_with_a_lone_surrogate_is_a_payload_error() -> None:
    with pytest.raises(PayloadError, match="not valid Unicode"):
        encode(sample({"name": "\ud800"}))
