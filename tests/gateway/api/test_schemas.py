"""What the gateway reads of a request (api/schemas.py): model, stream, include_usage, as vLLM's
lax request models read them; nothing is refused here."""

from __future__ import annotations

import pytest

from gateway.api.endpoints import ENDPOINTS
from gateway.api.schemas import lax_true, parse_other, parse_request

MSG = '[{"role": "user", "content": "hi"}]'


def test_valid_chat_request() -> None:
    r = parse_request(f'{{"model": "m", "messages": {MSG}, "stream": true}}'.encode(), "chat")
    assert (r.model, r.stream, r.client_wants_usage, r.readable) == ("m", True, False, True)


def test_include_usage_is_read() -> None:
    r = parse_request(
        f'{{"model": "m", "messages": {MSG}, "stream": true, '
        f'"stream_options": {{"include_usage": true}}}}'.encode(), "chat")
    assert r.client_wants_usage


@pytest.mark.parametrize("options", ['{"include_usage": null}', "{}", "null"])
def test_include_usage_null_or_unset_is_no_usage(options: str) -> None:
    # As `stream: null`, and as vLLM reads its Optional[bool]: not set, not a bad type.
    r = parse_request(
        f'{{"model": "m", "messages": {MSG}, "stream": true, '
        f'"stream_options": {options}}}'.encode(), "chat")
    assert (r.stream, r.client_wants_usage) == (True, False)


@pytest.mark.parametrize("raw", [
    # Fields vLLM serves that the gateway used to refuse: numeric strings, booleans it coerces,
    # values out of the gateway's old ranges (the engine judges them), any shape of messages.
    f'{{"model": "m", "messages": {MSG}, "max_tokens": "10"}}',
    f'{{"model": "m", "messages": {MSG}, "n": "2", "temperature": "0.5"}}',
    f'{{"model": "m", "messages": {MSG}, "logprobs": "true", "max_tokens": 5.0}}',
    f'{{"model": "m", "messages": {MSG}, "temperature": 3}}',
    '{"model": "m", "messages": "hi"}',
    '{"model": "m", "messages": []}',
])
def test_fields_other_than_model_and_stream_are_the_engines(raw: str) -> None:
    r = parse_request(raw.encode(), "chat")
    assert r.model == "m" and r.readable and not r.stream


@pytest.mark.parametrize(("raw", "model"), [
    (f'{{"messages": {MSG}}}', ""), (f'{{"model": "", "messages": {MSG}}}', ""),
    (f'{{"model": 3, "messages": {MSG}}}', ""), (f'{{"model": null, "messages": {MSG}}}', ""),
])
def test_a_model_the_gateway_cannot_read_is_no_model(raw: str, model: str) -> None:
    # The proxy then routes it to the one model served (the engine answers for the rest).
    assert parse_request(raw.encode(), "chat").model == model


@pytest.mark.parametrize(("value", "true"), [
    ("true", True), ('"true"', True), ('"True"', True), ('"yes"', True), ('"on"', True),
    ("1", True), ('"1"', True), ("false", False), ('"no"', False), ('"off"', False),
    ("0", False), ("null", False), ('"maybe"', False), ("[]", False)])
def test_stream_is_read_as_vllm_reads_it(value: str, true: bool) -> None:
    r = parse_request(f'{{"model": "m", "prompt": "x", "stream": {value}}}'.encode(), "completion")
    assert r.stream is true


def test_a_malformed_stream_options_is_left_alone() -> None:
    # Not an object: nothing is asked on the client's behalf, so nothing will be stripped.
    r = parse_request(b'{"model": "m", "prompt": "x", "stream": true, "stream_options": 1}',
                      "completion")
    assert r.stream and r.client_wants_usage


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b'"text"', b"nul"])
def test_unreadable_bodies_go_to_the_engine(raw: bytes) -> None:
    r = parse_request(raw, "chat")
    assert (r.readable, r.model, r.stream) == (False, "", False)


def test_lax_true_matches_pydantic() -> None:
    # vLLM's request models are pydantic's, lax mode: the gateway reads a bool as they do.
    from pydantic import TypeAdapter, ValidationError

    lax = TypeAdapter(bool)
    for v in (True, False, 0, 1, 2, 0.0, 1.0, "true", "FALSE", "yes", "n", "on", "off", "t",
              "f", "1", "0", "maybe", "", None, [], {}):
        try:
            expected = lax.validate_python(v)
        except ValidationError:
            expected = False  # refused by the engine: the gateway does not stream it
        assert lax_true(v) is expected, v


def test_other_endpoints_read_the_model_and_stream() -> None:
    responses = next(e for e in ENDPOINTS if e.path == "/v1/responses")
    r = parse_other(b'{"model": "m", "input": "x", "stream": "true"}', responses, b"")
    assert (r.model, r.stream, r.client_wants_usage) == ("m", True, True)
    assert parse_other(b"not json", responses, b"").model == ""
