from __future__ import annotations

import asyncio

import pytest

from gateway.routing.discovery.static import Static


async def test_yields_the_list_once_then_never_changes() -> None:
    it = Static(["http://a:1/", "http://b:1"]).updates()
    assert await anext(it) == {"http://a:1", "http://b:1"}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(anext(it), 0.05)
    await it.aclose()


async def test_empty_list_is_an_empty_set() -> None:
    it = Static([]).updates()
    assert await anext(it) == frozenset()
    await it.aclose()
