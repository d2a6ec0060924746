"""JSON text from operators (command-line arguments, ``publish --file`` lines, dashboard
request bodies), read strictly: NaN and Infinity are refused, as JSON has no such numbers."""

from __future__ import annotations

import json
from typing import Any

from shardq.core.envelope import refuse_constant


class NestedTooDeeply(ValueError):
    """JSON nested too deeply to read."""


def parse_json(text: str | bytes) -> Any:
    """The value of ``text``; a ValueError (:class:`NestedTooDeeply` when that is the
    reason) says what is wrong with it."""
    try:
        return json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise NestedTooDeeply("JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
