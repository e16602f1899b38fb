from __future__ import annotations

import orjson
import pytest

from gateway.errors import Unavailable, normalize_upstream_error


def shape(body: bytes) -> dict[str, object]:
    err = orjson.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for k in ("param", "code"):
        assert err[k] is None or isinstance(err[k], str)
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}',
         "bad"),
        (b'{"object": "error", "message": "old", "type": "BadRequestError", "code": 400}', "old"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"", "upstream returned HTTP 500"),
    ],
)
def test_upstream_errors_get_openai_shape(body: bytes, message: str) -> None:
    err = shape(normalize_upstream_error(500 if not body.startswith(b"{") else 400, body))
    assert err["message"] == message


def test_integer_codes_become_strings() -> None:
    err = shape(normalize_upstream_error(400, b'{"error": {"message": "m", "code": 400}}'))
    assert err["code"] == "400"


def test_retry_after_is_whole_seconds_and_never_zero() -> None:
    assert (b"retry-after", b"1") in Unavailable("x", retry_after=0.2).headers()
    assert (b"retry-after", b"3") in Unavailable("x", retry_after=2.6).headers()
