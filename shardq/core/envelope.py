"""The wire format: a versioned JSON envelope, optionally HMAC-signed
(``"sig1:<hex hmac-sha256>:" + json``, checked before parsing); docs/envelope.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shardq.core.errors import EnvelopeError, PayloadError

VERSION = 1
_SIG_PREFIX = "sig1:"
#: Said of a body that is not a shardq job at all, so that nobody upgrades a node for it.
NOT_ENVELOPE = (
    ": not a shardq envelope (a JSON object with v, worker, entity, payload, published_at "
    "and meta; see docs/envelope.md)"
)


@dataclass(frozen=True)
class Envelope:
    worker: str
    entity: str
    payload: Any
    published_at: float = field(default_factory=time.time)
    meta: dict[str, Any] = field(default_factory=dict)


def encode(env: Envelope, signing_key: bytes | None = None) -> str:
    """Serialise an envelope; raises :class:`PayloadError` for non-JSON payloads."""
    doc = {
        "v": VERSION,
        "worker": env.worker,
        "entity": env.entity,
        "payload": env.payload,
        "published_at": round(env.published_at, 6),
        "meta": env.meta,
    }
    whose = f"payload or meta for entity {env.entity!r} of worker {env.worker}"
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        bad = [(name, found) for name in ("payload", "meta") if (found := _bad_key(doc[name]))]
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"{whose} is not JSON-serialisable ({exc}); pass dicts, lists, strings, numbers, "
            "booleans or None, and convert dates and decimals to strings first"
        ) from exc
    except RecursionError:
        raise PayloadError(
            f"{whose} is nested too deeply to encode (or refers to itself); "
            "flatten it or store it elsewhere and publish a reference"
        ) from None
    if bad:  # JSON keys are strings: {1: "a", "1": "b"} would arrive as {"1": "b"}
        (name, (path, key)), *_ = bad
        raise PayloadError(
            f"{whose}: {name}{path} has the key {key!r} ({type(key).__name__}); JSON object "
            f'keys must be strings (it would arrive as "{json.dumps(key)}", replacing any key '
            "of that text): convert the keys to strings first"
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"{whose} contains a string that is not valid Unicode ({exc.reason}: "
                f"{exc.object[exc.start : exc.end]!r}); a lone surrogate such as '\\ud800' "
                "usually comes from mis-decoded bytes: decode them with errors='replace'"
            ) from None
        # the two characters JSON leaves raw that SQS refuses in a body: as escapes
        text = text.replace("\ufffe", "\\ufffe").replace("\uffff", "\\uffff")
    if signing_key is None:
        return text
    return f"{_SIG_PREFIX}{_sign(signing_key, text)}:{text}"


def decode(body: str, signing_key: bytes | None = None) -> Envelope:
    """Parse a body; raises :class:`EnvelopeError` saying why it is not valid."""
    if signing_key is not None:
        if not body.startswith(_SIG_PREFIX):
            raise EnvelopeError("message is not signed but a signing key is configured")
        sig, sep, body = body[len(_SIG_PREFIX) :].partition(":")
        expected = _sign(signing_key, body).encode("ascii")
        if not sep or not hmac.compare_digest(sig.lower().encode("utf-8"), expected):
            raise EnvelopeError("message signature does not match the signing key")
    elif body.startswith(_SIG_PREFIX):
        raise EnvelopeError("message is signed but no signing key is configured")
    try:
        if body.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", body, 0)
        doc = _DECODER.decode(body)
    except TooLarge as exc:  # valid JSON, but not as a double
        raise EnvelopeError(
            f"the envelope holds a number too large for a double ({exc.number})"
        ) from None
    except ValueError as exc:
        raise EnvelopeError(f"message body is not JSON ({exc}){NOT_ENVELOPE}") from exc
    except RecursionError as exc:  # "[[[[..." nested deeper than Python's stack
        raise EnvelopeError(
            f"message body is JSON nested too deeply to decode{NOT_ENVELOPE}"
        ) from exc
    if not isinstance(doc, dict):
        raise EnvelopeError(f"message body is not a JSON object{NOT_ENVELOPE}")
    if "v" not in doc:
        keys = ", ".join(sorted(map(repr, doc))[:8]) or "none"
        raise EnvelopeError(
            f'message body is a JSON object with no "v" (keys: {keys}){NOT_ENVELOPE}'
        )
    version = doc.get("v")
    if type(version) is not int or version != VERSION:
        raise EnvelopeError(
            f"envelope version {version!r} is not supported by this shardq (expects "
            f"{VERSION}); upgrade the node or publish with a matching version"
        )
    worker, entity, published_at = doc.get("worker"), doc.get("entity"), doc.get("published_at")
    meta = doc.get("meta", {})
    if not isinstance(worker, str) or not worker:
        raise EnvelopeError("envelope has no worker name")
    if not isinstance(entity, str) or not entity:
        raise EnvelopeError("envelope has no entity id")
    if not isinstance(published_at, (int, float)) or isinstance(published_at, bool):
        raise EnvelopeError("envelope has no numeric published_at")
    if not isinstance(meta, dict):
        raise EnvelopeError("envelope meta is not an object")
    if "payload" not in doc:
        raise EnvelopeError("envelope has no payload")
    return Envelope(worker, entity, doc["payload"], float(published_at), meta)


def _bad_key(value: Any) -> tuple[str, Any] | None:
    """The path (``['items'][1]``) to a dict in ``value`` with a key that is not a string,
    and that key; None when there is none."""
    array = isinstance(value, (list, tuple))
    pairs: Iterable[tuple[Any, Any]] = value.items() if isinstance(value, dict) else ()
    for key, item in enumerate(value) if array else pairs:
        if isinstance(value, dict) and not isinstance(key, str):
            return "", key
        if isinstance(item, (dict, list, tuple)) and (found := _bad_key(item)):
            return f"[{key!r}]{found[0]}", found[1]
    return None


def refuse_constant(name: str) -> Any:
    """``json.loads(..., parse_constant=refuse_constant)``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not a JSON number")


class NestedTooDeeply(ValueError):
    """JSON nested too deeply to read."""


class TooLarge(ValueError):
    """A JSON number too large for a double (``number``: its text), which reads as infinity."""

    def __init__(self, number: str) -> None:
        super().__init__(f"{number} is too large for a JSON number")
        self.number = number


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity
        raise TooLarge(text)
    return value


def parse_json(text: str | bytes) -> Any:
    """Operator JSON (arguments, ``publish --file`` lines, request bodies, old morgue
    records) read strictly; a ValueError (:class:`NestedTooDeeply` when that is the reason)
    says what is wrong. NaN, Infinity, numbers too large for a float and a key given
    twice in one object are refused."""
    try:
        return json.loads(
            text, parse_constant=refuse_constant, parse_float=_finite, object_pairs_hook=_once
        )
    except RecursionError:
        raise NestedTooDeeply("JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once (which of two values is meant is unknown)."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"key {key!r} is given twice")
        doc[key] = value
    return doc


#: One decoder for every body (``json.loads`` with arguments builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=refuse_constant, parse_float=_finite)


def _sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()
