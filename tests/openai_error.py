"""The OpenAI error body, as the tests check it: the gateway's own (gateway/errors.py) and an
engine's, relayed as it wrote it."""

from __future__ import annotations

import json
from typing import Any

import httpx


def openai_error(body: bytes | str) -> dict[str, Any]:
    """The `error` object of an OpenAI error body, its shape checked: exactly message, type, param
    and code; a message and a type; param null or a string; code null, a string (the gateway's
    own) or an integer (an engine's)."""
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str), err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str | int), err
    return dict(err)


def assert_openai_error(resp: httpx.Response, status: int,
                        code: str | None = None) -> dict[str, Any]:
    """`resp` is an OpenAI error of `status` (with `code`, when given): its error object."""
    assert resp.status_code == status, resp.text
    err = openai_error(resp.content)
    if code is not None:
        assert err["code"] == code, err
    return err
