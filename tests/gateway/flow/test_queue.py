from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.flow.queue import FairQueue, QueueFull, Waiter


def waiter(tenant: str, cls: int = 1, weight: float = 1.0) -> Waiter:
    return Waiter(asyncio.get_running_loop().create_future(), tenant, cls, weight, 0.0)


def drain(q: FairQueue) -> list[Waiter]:
    out = []
    while (w := q.pop()) is not None:
        out.append(w)
    return out


async def test_priority_classes_are_strict() -> None:
    q = FairQueue(100)
    q.push(waiter("a", cls=2))
    q.push(waiter("a", cls=1))
    q.push(waiter("b", cls=0))
    assert [w.cls for w in drain(q)] == [0, 1, 2]


async def test_round_robin_between_tenants_regardless_of_volume() -> None:
    q = FairQueue(1000)
    for _ in range(100):
        q.push(waiter("heavy"))
    for _ in range(10):
        q.push(waiter("light"))
    first20 = Counter(w.tenant for w in drain(q)[:20])
    assert first20 == {"heavy": 10, "light": 10}


async def test_weights_give_proportional_turns() -> None:
    q = FairQueue(1000)
    for _ in range(100):
        q.push(waiter("gold", weight=3.0))
        q.push(waiter("std", weight=1.0))
    first40 = Counter(w.tenant for w in drain(q)[:40])
    assert first40 == {"gold": 30, "std": 10}


async def test_fractional_weight_accumulates() -> None:
    q = FairQueue(1000)
    for _ in range(50):
        q.push(waiter("half", weight=0.5))
        q.push(waiter("one", weight=1.0))
    first30 = Counter(w.tenant for w in drain(q)[:30])
    assert first30 == {"one": 20, "half": 10}


async def test_removed_entries_are_skipped_and_counted_out() -> None:
    q = FairQueue(10)
    ws = [waiter("a") for _ in range(3)]
    for w in ws:
        q.push(w)
    q.remove(ws[0])
    q.remove(ws[0])  # idempotent
    assert len(q) == 2
    assert drain(q) == ws[1:]
    assert len(q) == 0


async def test_full_queue_pushes_out_the_hog_not_the_newcomer() -> None:
    q = FairQueue(4)
    hog = [waiter("hog") for _ in range(4)]
    for w in hog:
        q.push(w)
    newcomer = waiter("polite")
    evicted = q.push(newcomer)
    assert evicted is hog[-1]  # the hog's newest
    assert len(q) == 4
    # The hog itself cannot push anyone out to make room for more of its own.
    with pytest.raises(QueueFull):
        q.push(waiter("hog"))
    # A lower class gives way to a higher one.
    q2 = FairQueue(2)
    low = [waiter("x", cls=2), waiter("x", cls=2)]
    for w in low:
        q2.push(w)
    assert q2.push(waiter("x", cls=0)) is low[-1]


async def test_position_estimate_counts_only_fair_share_of_others() -> None:
    q = FairQueue(1000)
    for _ in range(100):
        q.push(waiter("heavy"))
    q.push(waiter("vip", cls=0))
    # The light tenant's next request goes after the vip and one turn of the heavy tenant.
    assert q.ahead_of("light", 1, 1.0) == 2
    assert q.ahead_of("heavy", 1, 1.0) == 101
