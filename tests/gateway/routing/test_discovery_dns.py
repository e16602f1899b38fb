from __future__ import annotations

import asyncio

from gateway.routing.discovery.dns import DnsDiscovery, resolve_a


async def test_reresolves_and_yields_only_changes() -> None:
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.1"], ["10.0.0.3"]]
    calls = 0

    async def resolver(name: str) -> list[str]:
        nonlocal calls
        assert name == "workers.ns.svc"
        calls += 1
        ans = answers[min(calls - 1, len(answers) - 1)]
        return ans

    d = DnsDiscovery("workers.ns.svc", 8000, interval_s=0.01, resolver=resolver)
    it = d.updates().__aiter__()
    assert await it.__anext__() == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"}
    # The reordered second answer is the same set: not yielded again.
    assert await it.__anext__() == {"http://10.0.0.3:8000"}
    assert calls == 3
    await it.aclose()  # type: ignore[attr-defined]


async def test_lookup_failure_keeps_last_known_set() -> None:
    calls = 0

    async def resolver(name: str) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("temporary failure in name resolution")
        return ["10.0.0.1"] if calls == 1 else ["10.0.0.9"]

    d = DnsDiscovery("w", 1, interval_s=0.01, resolver=resolver)
    it = d.updates().__aiter__()
    assert await it.__anext__() == {"http://10.0.0.1:1"}
    assert await asyncio.wait_for(it.__anext__(), 2) == {"http://10.0.0.9:1"}
    await it.aclose()  # type: ignore[attr-defined]


async def test_real_resolver_resolves_localhost() -> None:
    assert "127.0.0.1" in await resolve_a("localhost")
