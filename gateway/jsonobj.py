"""A body the gateway reads but does not own (a request, an engine's answer or event): a JSON
object, or None for anything else, which the caller then leaves to the engine or relays as is."""

from __future__ import annotations

from typing import Any

import orjson


def json_object(raw: bytes) -> dict[str, Any] | None:
    """`raw` parsed, when it is a JSON object; None when it is empty, not JSON or not an object."""
    if not raw:
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None
