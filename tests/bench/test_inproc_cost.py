"""bench.inproc_cost times the gateway's Python per request: the figure means something only if
each timed request went through the whole app and was answered as a client would be."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from bench.inproc_cost import measure


@pytest.mark.parametrize("stream", [True, False])
def test_each_timed_request_is_served_whole(stream: bool) -> None:
    per, driver, stats = asyncio.run(measure(50, stream, profile=False))
    assert stats is None
    assert driver.status == 200, driver.last
    assert 0 < per < 0.05
    if stream:
        # The gateway asked for usage on its own account and stripped it again: the client did
        # not ask for it.
        assert driver.last.endswith(b"data: [DONE]\n\n")
        assert b'"content":"hi"' in driver.last and b'"usage"' not in driver.last
    else:
        assert orjson.loads(driver.last)["choices"][0]["message"]["content"] == "hi"


def test_the_profile_covers_the_proxy() -> None:
    _, _, stats = asyncio.run(measure(20, True, profile=True))
    assert stats is not None
    functions = {name for _, _, name in stats.stats}  # type: ignore[attr-defined]
    assert "relay_stream" in functions
