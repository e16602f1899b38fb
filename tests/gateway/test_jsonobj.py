"""json_object: the one reading of a body as a JSON object (requests, answers, events)."""

from __future__ import annotations

import pytest

from gateway.jsonobj import json_object


@pytest.mark.parametrize(("raw", "want"), [
    (b'{"model": "m", "n": [1]}', {"model": "m", "n": [1]}),
    (b"{}", {}),
    (b"", None),
    (b"[1, 2]", None),  # JSON, but not an object
    (b'"text"', None),
    (b"null", None),
    (b"<html>bad gateway</html>", None),
    (b'{"model": "m"', None),  # cut short
])
def test_an_object_or_none(raw: bytes, want: dict[str, object] | None) -> None:
    assert json_object(raw) == want
