from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from gateway.routing.discovery.dns import Dns, resolve_a
from gateway.settings import GatewaySettings


async def test_reresolves_and_yields_only_changes() -> None:
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.1"], ["10.0.0.3"]]
    calls = 0

    async def resolver(name: str) -> list[str]:
        nonlocal calls
        assert name == "workers.ns.svc"
        calls += 1
        return answers[min(calls - 1, len(answers) - 1)]

    it = Dns("workers.ns.svc", 8000, interval_s=0.01, resolver=resolver).updates()
    assert await anext(it) == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    # The reordered second answer is the same set: not yielded again.
    assert await anext(it) == {"http://10.0.0.3:8000"}
    assert calls == 3
    await it.aclose()


async def test_lookup_failure_keeps_last_known_set() -> None:
    calls = 0

    async def resolver(name: str) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("temporary failure in name resolution")
        return ["10.0.0.1"] if calls == 1 else ["10.0.0.9"]

    it = Dns("w", 1, interval_s=0.01, resolver=resolver).updates()
    assert await anext(it) == {"http://10.0.0.1:1"}
    # The failed lookup in between yielded nothing (not an empty set).
    assert await asyncio.wait_for(anext(it), 2) == {"http://10.0.0.9:1"}
    assert calls == 3
    await it.aclose()


async def test_real_resolver_resolves_localhost() -> None:
    assert "127.0.0.1" in await resolve_a("localhost")


async def test_real_dns_discovery_of_localhost() -> None:
    # The default resolver (the loop's getaddrinfo) end to end, with a name every host has.
    it = Dns("localhost", 8123, interval_s=0.01).updates()
    assert "http://127.0.0.1:8123" in await asyncio.wait_for(anext(it), 5)
    await it.aclose()


async def test_failing_first_lookup_starts_empty() -> None:
    # The first yield is the initial set, even when that set is empty because DNS is down.
    async def resolver(name: str) -> list[str]:
        raise OSError("Name or service not known")

    it = Dns("workers", 8000, interval_s=0.01, resolver=resolver).updates()
    assert await asyncio.wait_for(anext(it), 2) == frozenset()
    await it.aclose()


def test_settings_reject_a_non_positive_interval() -> None:
    with pytest.raises(ValidationError, match="dns_interval_s"):
        GatewaySettings(discovery="dns", dns_name="w", dns_interval_s=0)
