from __future__ import annotations

import pytest

from gateway.api.schemas import parse_request
from gateway.errors import InvalidRequest

MSG = '[{"role": "user", "content": "hi"}]'


def bad(raw: str, kind: str = "chat") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse_request(raw.encode(), kind)  # type: ignore[arg-type]
    return info.value


def test_valid_chat_request() -> None:
    r = parse_request(f'{{"model": "m", "messages": {MSG}, "stream": true}}'.encode(), "chat")
    assert (r.model, r.stream, r.client_wants_usage) == ("m", True, False)


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


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "m", "messages": "hi"}', "messages"),
        ('{"model": "m", "messages": []}', "messages"),
        ('{"model": "m", "messages": [{"content": "x"}]}', "messages[0]"),
        (f'{{"messages": {MSG}}}', "model"),
        (f'{{"model": 3, "messages": {MSG}}}', "model"),
        (f'{{"model": "m", "messages": {MSG}, "stream": "yes"}}', "stream"),
        (f'{{"model": "m", "messages": {MSG}, "max_tokens": "10"}}', "max_tokens"),
        (f'{{"model": "m", "messages": {MSG}, "max_tokens": 0}}', "max_tokens"),
        (f'{{"model": "m", "messages": {MSG}, "max_tokens": true}}', "max_tokens"),
        (f'{{"model": "m", "messages": {MSG}, "max_tokens": 5.5}}', "max_tokens"),
        # Past uint64 the parser reads a float: out of the integer range, not a count.
        (f'{{"model": "m", "messages": {MSG}, "max_tokens": 18446744073709551616}}',
         "max_tokens"),
        (f'{{"model": "m", "messages": {MSG}, "temperature": 3}}', "temperature"),
        (f'{{"model": "m", "messages": {MSG}, "stream_options": {{"include_usage": true}}}}',
         "stream_options"),
        (f'{{"model": "m", "messages": {MSG}, "stream": true, "stream_options": 1}}',
         "stream_options"),
    ],
)
def test_bad_fields_name_the_param(raw: str, param: str) -> None:
    assert bad(raw).param == param


@pytest.mark.parametrize("raw", ["", "{", "[1, 2]", '"text"', "nul"])
def test_malformed_bodies(raw: str) -> None:
    assert bad(raw).status == 400


@pytest.mark.parametrize("prompt", ['"x"', '["a", "b"]', "[1, 2]", "[[1], [2, 3]]", "[1.0, 2]"])
def test_completion_prompt_forms(prompt: str) -> None:
    assert parse_request(f'{{"model": "m", "prompt": {prompt}}}'.encode(), "completion").model == "m"


@pytest.mark.parametrize("prompt", ["3", "[]", '["a", 1]', "[[]]", "null"])
def test_bad_completion_prompts(prompt: str) -> None:
    assert bad(f'{{"model": "m", "prompt": {prompt}}}', "completion").param == "prompt"


def test_an_integral_float_is_an_integer() -> None:
    """As in JSON Schema and in the engine's own (pydantic, lax) validation."""
    assert parse_request(f'{{"model": "m", "messages": {MSG}, "max_tokens": 5.0}}'.encode(),
                         "chat").body["max_tokens"] == 5.0
