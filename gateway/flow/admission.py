"""Admission control: per-key limits, then a slot in the pool of the requested model.

Order for one request: the tenant's token buckets (429 `rate_limit_exceeded`), then the pool's
adaptive concurrency limit. Below the limit with nobody queued a request is admitted at once: an
integer compare and increment, no future, no task. Otherwise it waits in the pool's fair queue,
but only if the door can promise it a slot within the queue timeout; else it is refused at once
(503 with Retry-After), so the client hears "retry in N s" within milliseconds. The promise is

- while the limit still climbs, from a cold start or after a pause (slow start, limiter.py), and
  nothing shows the engines full yet: fewer requests ahead of it than `PROMISE` x those in
  flight, each of which adds two slots when its first token comes back fast;
- once the engines have shown their capacity: a slot expected within half the timeout at the
  pool's pace now (retry_after.py: the requests in flight and how long requests take from
  admission to release).

A queued request whose estimate proves too hopeful (usually a limit cut while it waited) is sent
at its deadline above the limit (`llmserve_queue_overflows_total`) rather than refused after a
wasted wait. One queued on slow start's promise is refused as soon as the promise is seen broken
(slow start ended by evidence of full engines, or a request in flight overdue for its first token:
sent, it would wait inside them past the target), and sent at its deadline otherwise (a burst's
first tokens may all come after it: nothing shows the engines full), unless an engine that holds
streams sent with those it started is being judged: then it waits for that verdict, up to half
a timeout more. In slow start a fast first token's slots count only once the streams sent with
it have theirs (`Pool.sample`). Why both promises need this shape: docs/flow-control.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from time import monotonic

from gateway.errors import GatewayError, RateLimited, Unavailable, retry_after_s
from gateway.flow.limiter import AimdLimiter
from gateway.flow.queue import FairQueue, QueueFull, Waiter
from gateway.flow.retry_after import Pace, expected_wait, retry_after
from gateway.flow.shared_limits import SharedLimits
from gateway.flow.tenants import ANONYMOUS, Tenant, Tenants
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings

# Queue a request only if it is expected to get its slot within this share of the queue timeout:
# the estimate rests on a noisy pace, and a refusal now costs milliseconds, a queue timeout
# the whole timeout for the same 503.
QUEUE_HEADROOM = 0.5
# In slow start, a request in flight this many times the climb's fastest first token without its
# own shows the engines queueing: the limit has reached their capacity, whatever it says.
OVERDUE = 1.5
# ... and never sooner than this share of the engines' part of the TTFT target after its dispatch:
# a continuously batching engine serves a burst in steps that lengthen with every prompt they take
# in, so its first tokens come back at two or three times the fastest while it is far from full
# (half the target is where a late first token ends the climb: limiter.SLOW_START_BELOW).
OVERDUE_TARGET = 0.5
# ... and never sooner than this after its dispatch: a first token within milliseconds (a
# near-free upstream) measures the gateway's own loop, whose least lag would read as an overdue
# request and refuse a cold burst that healthy engines serve.
MIN_OVERDUE_S = 0.05
# In slow start, queue up to this many requests per request in flight: most of the next round
# trip's growth. Not all of it: against full engines each request so queued waits about OVERDUE
# first tokens for its refusal (docs/flow-control.md).
PROMISE = 1.5
# A fast first token's slots wait for the streams sent up to this long after it (with it: in the
# same engine step, or arriving in the same instant as a load generator's connections).
SENT_WITH_S = 0.001
# A request queued on the climb's promise waits for a verdict due up to this share of the queue
# timeout after its deadline (`Pool._await_verdict`).
VERDICT_GRACE = 0.5


class Pool:
    """One model's backends as admission sees them: limit, in-flight count, queue, pace."""

    __slots__ = ("_answered", "_clock", "_held", "_metrics", "_overflows", "_pending", "_promised",
                 "_queue_time", "_replicas", "_settings", "_watch", "_weights", "by_tenant",
                 "in_flight", "limiter", "name", "pace", "queue")

    def __init__(
        self, name: str, settings: FlowSettings, metrics: GatewayMetrics,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._queue_time = metrics.queue_time.labels(name)
        self._overflows = metrics.queue_overflows.labels(name)
        self.limiter = AimdLimiter(
            initial=settings.initial_limit, floor=settings.min_limit, ceiling=settings.max_limit,
            target_s=settings.ttft_target_s - settings.queue_timeout_s, backoff=settings.backoff,
            clock=clock,
        )
        self.queue = FairQueue(settings.max_queue)
        self.pace = Pace(clock)
        self.in_flight = 0
        # In slow start: the requests in flight without a first token yet (a whole answer: not
        # ended yet), oldest first (see `_climbing`): when each was sent, whether it was sent
        # alone (no other pending then: prefilled alone, its time is no pace for a burst's), and
        # whether it streams (only a stream shows its first token).
        self._pending: deque[tuple[float, bool, bool]] = deque()
        # ... and when the latest-sent stream with a first token was sent, plus SENT_WITH_S: a
        # stream sent no later still waiting was overtaken, or left behind by its burst (a whole
        # answer shows only its end: a short one sent with a long one comes back first).
        self._answered = float("-inf")
        # Slots earned by fast first tokens and held back (`sample`): with the time before which
        # every stream sent must have shown its first token for them to count.
        self._held: list[tuple[float, float]] = []
        self._replicas = 0  # available, as last told (set_replicas)
        # Requests queued on slow start's promise, and the timer that refuses them as soon as
        # the promise is seen broken (`_check_promises`).
        self._promised: list[Waiter] = []
        self._watch: asyncio.TimerHandle | None = None
        # Admitted requests per tenant (and its weight), for the fair-share check below.
        self.by_tenant: dict[str, int] = {}
        self._weights: dict[str, float] = {}

    # -- per request -----------------------------------------------------------------------------

    def try_acquire(self, tenant: str = ANONYMOUS, weight: float = 1.0,
                    stream: bool = True) -> bool:
        """The fast path: a free slot and nobody waiting for it. `stream`: the request streams
        its answer (its first token will be sampled), else it is a whole answer."""
        if not self.in_flight:
            self.limiter.on_idle()  # the first request after a pause: slow start resumes
        if self.in_flight < self.limiter.limit and not self.queue._size:
            self._take(tenant, weight, stream)
            self._queue_time.observe(0.0)
            return True
        return False

    def _take(self, tenant: str, weight: float, stream: bool) -> None:
        now = self._clock()
        self.pace.took(self.in_flight, now)
        self.in_flight += 1
        if self.limiter.slow_start:
            pending = self._pending
            pending.append((now, not pending, stream))
        bt = self.by_tenant
        n = bt.get(tenant)
        if n is None:
            bt[tenant] = 1
            self._weights[tenant] = weight
        else:
            bt[tenant] = n + 1

    def under_share(self, tenant: Tenant) -> bool:
        """True if `tenant` holds fewer slots than its weighted share of the limit among the
        tenants holding slots now: it then gets one at once, even above the limit.

        The queue alone cannot keep a light tenant's share: with a short queue timeout and
        streams of seconds it holds a request or two, so a heavy tenant keeping it full would
        lock a newcomer out. The others give the slots back as their requests finish (the queue
        is only dispatched below the limit), so the overshoot is bounded by the shares."""
        mine = self.by_tenant.get(tenant.name, 0)
        others = [t for t in self.by_tenant if t != tenant.name]
        if not others:
            return False  # nobody else holds a slot: no share to defend
        total = tenant.weight + sum(self._weights[t] for t in others)
        return mine + 1 <= self.limiter.limit * tenant.weight / total

    async def acquire(self, tenant: Tenant, cls: int, stream: bool = True) -> None:
        """Wait for a slot; raises `Unavailable` (503 with Retry-After) when refused."""
        if self.try_acquire(tenant.name, tenant.weight, stream):
            return
        if self.under_share(tenant):
            self._take(tenant.name, tenant.weight, stream)
            self._queue_time.observe(0.0)
            return
        s = self._settings
        service = self.pace.service_s
        ahead = self.queue.ahead_of(tenant.name, cls, tenant.weight)
        # The two promises of the module docstring. While the limit climbs (from a start or a
        # pause) only the climb's: the pace of the requests before a pause says nothing of the
        # burst after it, which may hold prompts ten times as long.
        if self.limiter.slow_start:
            served = False
            promised = ahead < PROMISE * self.in_flight and self._climbing()
        else:
            served = service > 0.0 and (
                expected_wait(ahead, self.in_flight, self.limiter.limit, service)
                <= s.queue_timeout_s * QUEUE_HEADROOM)
            promised = False
        if not (served or promised):
            raise self._refuse("queue_wait", ahead)
        loop = asyncio.get_running_loop()
        now = self._clock()
        w = Waiter(loop.create_future(), tenant.name, cls, tenant.weight, now, stream=stream)
        try:
            evicted = self.queue.push(w)
        except QueueFull:
            raise self._refuse("queue_full", len(self.queue)) from None
        # Answered here, at once. Unless it is leaving anyway: a waiter whose client went away or
        # whose deadline fired has its future cancelled a loop step before its own cleanup takes
        # it out of the queue, and answering it again would raise InvalidStateError right here.
        if evicted is not None and not evicted.future.done():
            evicted.future.set_exception(self._refuse("queue_full", len(self.queue)))
        if promised:
            self._promised.append(w)
            self._check_promises()
        try:
            try:
                async with asyncio.timeout(s.queue_timeout_s):
                    await w.future
            except TimeoutError:
                if promised and not self._granted(w):
                    await self._await_verdict(w, now + s.queue_timeout_s * (1 + VERDICT_GRACE))
                if not self._granted(w):  # else the slot came in the same instant as a deadline
                    self.queue.remove(w)
                    if promised and not self._climbing():
                        # Queued on slow start's promise, and the engines turned out to be full:
                        # sent now, it would wait inside them past the target. Otherwise nothing
                        # shows them full (a burst's first tokens may all come after the deadline).
                        self._queue_time.observe(self._clock() - now)
                        raise self._refuse("queue_timeout", len(self.queue)) from None
                    self._take(tenant.name, tenant.weight, stream)
                    self._overflows.inc()
        except asyncio.CancelledError:
            if self._granted(w):
                self.release(tenant.name, stream)
            else:
                self.queue.remove(w)
            raise
        self._queue_time.observe(self._clock() - now)

    async def _await_verdict(self, w: Waiter, until: float) -> None:
        """Past its deadline, a request queued on the climb's promise waits for the verdict on an
        engine that holds streams sent with those it started (`_verdict_at`), if it is due by
        `until`: sent a moment before it, the request would join a full engine's queue, and
        refused, it would lose the slots that engine gives when it starts them after all. It
        keeps its place in the queue (its future, cancelled by the deadline, is renewed) and is
        granted, refused (raises) or neither by then."""
        verdict = self._verdict_at()
        if verdict is None or verdict > until:
            return
        w.future = asyncio.get_running_loop().create_future()
        # A millisecond after it: the promise's own watch (`_check_promises`) decides first.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, verdict - self._clock()) + 1e-3):
                await w.future

    def _climbing(self) -> bool:
        """The limit is still climbing from a cold start and nothing shows the engines full yet:
        slow start, and no request in flight overdue for its first token (before the first one
        comes back nothing is known, and the climb is given the benefit of the doubt)."""
        if not self.limiter.slow_start:
            return False
        first = self.limiter.first_token_s
        oldest = self._oldest_stream()
        return first <= 0.0 or oldest is None or not self._overdue(oldest, first)

    def _overdue(self, sent: float, first: float) -> bool:
        return self._clock() >= self._overdue_at(sent, first)

    def _overdue_at(self, sent: float, first: float) -> float:
        """When a request in flight since `sent` without a first token shows the engines
        queueing, given the climb's fastest first token: OVERDUE of those after it was sent if a
        stream sent with it or after it has its first token (the engine took that one and not
        this one; one replica only), else at OVERDUE_TARGET of the target."""
        late = sent + OVERDUE_TARGET * self.limiter.target_s
        if self._left_behind(sent):
            return min(late, sent + max(OVERDUE * first, MIN_OVERDUE_S))
        return late

    def _left_behind(self, sent: float) -> bool:
        """A stream sent then, still without a first token, was overtaken or left behind by the
        burst it was sent with. Only one engine's queue shows it: across replicas, a request
        sent later may have gone to a less busy one."""
        return sent <= self._answered and self._replicas <= 1

    def _verdict_at(self) -> float | None:
        """When the climb's promise will be judged, if an engine left a stream behind (else
        None: nothing is being judged, the late rule aside)."""
        first = self.limiter.first_token_s
        oldest = self._oldest_stream()
        if first <= 0.0 or oldest is None or not self._left_behind(oldest):
            return None
        return self._overdue_at(oldest, first)

    def _check_promises(self) -> None:
        """Refuse the requests queued on slow start's promise as soon as it is broken (slow start
        over, or the oldest request in flight overdue for its first token), rather than at their
        deadline; until then look again when that request becomes overdue."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        waiting = [w for w in self._promised if not w.future.done()]
        self._promised = waiting
        if not waiting:
            return
        first = self.limiter.first_token_s
        if self.limiter.slow_start:
            oldest = self._oldest_stream()
            if first <= 0.0 or oldest is None:
                return  # nothing to judge yet: the next first token looks again
            wait = self._overdue_at(oldest, first) - self._clock()
            if wait > 1e-6:
                self._watch = asyncio.get_running_loop().call_later(wait, self._check_promises)
                return
        self._promised = []
        for w in waiting:
            self.queue.remove(w)
            self._queue_time.observe(self._clock() - w.enqueued)
            w.future.set_exception(self._refuse("queue_timeout", len(self.queue)))

    def release(self, tenant: str = ANONYMOUS, stream: bool = True) -> None:
        """A request admitted with `stream` ended (answered, failed or abandoned)."""
        now = self._clock()
        self.pace.released(self.in_flight, now)
        self.in_flight -= 1
        pending = self._pending
        if not self.in_flight:
            # None in flight, none pending: one that ended without a sample while others had
            # theirs (its entry could not be told apart from theirs) goes now, not into the next
            # burst, whose first request would no longer count as sent alone. Slots held for
            # streams that ended without a first token go too: nothing showed room for them.
            pending.clear()
            self._held.clear()
        elif len(pending) > self.in_flight:  # it ended without a sample (an error, a hang-up)
            # Which one is not known: take the newest of its kind. An engine's error comes back
            # within milliseconds, while the older ones still wait; and the oldest may be the
            # one sent alone, whose flag must stay with the sample it will give.
            for i in range(len(pending) - 1, -1, -1):
                if pending[i][2] is stream:
                    del pending[i]
                    break
        if self._held:
            self._release_held()
        n = self.by_tenant[tenant] - 1
        if n:
            self.by_tenant[tenant] = n
        else:
            del self.by_tenant[tenant]
            del self._weights[tenant]
        if self.queue._size:
            self._dispatch()

    def sample(self, ttft_s: float, dispatched_at: float) -> None:
        """A streamed request's upstream TTFT."""
        before = self.limiter.limit
        entry = self._oldest(True)
        until = dispatched_at + SENT_WITH_S
        # A fast first token adds its slots once the streams sent with it have theirs too: an
        # engine that starts some of a burst and holds the rest has no room for more, however
        # fast it started those (a continuously batching one starts the rest a step later).
        hold = False
        if self.limiter.slow_start:
            nxt = self._oldest_stream(after=entry)
            hold = nxt is not None and nxt <= until
        held = self.limiter.on_sample(ttft_s, dispatched_at, self.in_flight,
                                      paced=entry is None or not entry[1], hold=hold)
        if held:
            self._held.append((until, held))
        self._answered = max(self._answered, until)
        self._sampled(before, entry)

    def sample_whole(self, latency_s: float, tokens: int, dispatched_at: float) -> None:
        """A whole (non-streamed) answer's upstream latency and its generated tokens."""
        before = self.limiter.limit
        entry = self._oldest(False)
        self.limiter.on_whole_sample(latency_s, tokens, dispatched_at, self.in_flight,
                                     paced=entry is None or not entry[1])
        self._sampled(before, entry)

    def _oldest(self, stream: bool) -> tuple[float, bool, bool] | None:
        """The oldest pending request of that kind: first tokens come back about in dispatch
        order, so a sample is the oldest stream's (a whole answer's, the oldest whole one's).
        Its request may set the climb's pace unless it was sent alone (`_pending`)."""
        for entry in self._pending:
            if entry[2] is stream:
                return entry
        return None

    def _oldest_stream(self, after: tuple[float, bool, bool] | None = None) -> float | None:
        """When the oldest pending stream was sent (other than `after`); None: none pending."""
        for entry in self._pending:
            if entry[2] and entry is not after:
                return entry[0]
        return None

    def _release_held(self) -> None:
        """Add the held slots whose streams have all shown a first token (`sample`)."""
        held = self._held
        if not self.limiter.slow_start:
            held.clear()
            return
        oldest = self._oldest_stream()
        ready = [h for h in held if oldest is None or h[0] < oldest]
        if ready:
            self._held = [h for h in held if not (oldest is None or h[0] < oldest)]
            self.limiter.climb(sum(slots for _, slots in ready))

    def _sampled(self, before: int, entry: tuple[float, bool, bool] | None) -> None:
        """After a sample of the pending request `entry` (see `_oldest`)."""
        pending = self._pending
        if pending:
            if self.limiter.slow_start:
                if entry is not None:
                    pending.remove(entry)
            else:
                pending.clear()
        if self._held:
            self._release_held()
        if self._promised:
            self._check_promises()
        if self.limiter.limit > before and self.queue._size:
            self._dispatch()  # new slots go to whoever waits now

    def set_replicas(self, replicas: int) -> None:
        """The model's available replicas: the limit's ceiling is `max_limit` per replica, so a
        fleet is never capped at one engine's worth. None available says nothing about the
        capacity that comes back: the ceiling stays."""
        self._replicas = replicas
        if replicas > 0:
            self.limiter.set_ceiling(self._settings.max_limit * replicas)

    # -- internals -------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        limit = self.limiter.limit
        while self.in_flight < limit:
            w = self.queue.pop()
            if w is None:
                return
            if w.future.done():  # cancelled in the same instant: not a taker
                continue
            self._take(w.tenant, w.weight, w.stream)
            w.future.set_result(None)

    @staticmethod
    def _granted(w: Waiter) -> bool:
        f = w.future
        return f.done() and not f.cancelled() and f.exception() is None

    def _refuse(self, reason: str, ahead: int) -> GatewayError:
        self._metrics.rejections.labels(self.name, reason).inc()
        # Before any request has ended, a slot per request in flight takes about the target.
        wait = retry_after(ahead, self.in_flight, self.limiter.limit,
                           self.pace.service_s or self.limiter.target_s)
        what = {
            "queue_full": "the queue is full",
            "queue_wait": "the queue is too long to be served in time",
            "queue_timeout": "no slot came free in time",
        }[reason]
        return Unavailable(
            f"model '{self.name}' is overloaded ({what}); retry after {retry_after_s(wait)}s",
            code="overloaded", retry_after=wait,
        )


class Admission:
    """All pools and tenants of one gateway."""

    def __init__(
        self, settings: FlowSettings, metrics: GatewayMetrics,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._metrics = metrics
        self._pools: dict[str, Pool] = {}
        self._replicas: dict[str, int] = {}  # available replicas per model, as last told
        self._shared = (SharedLimits(settings, metrics)
                        if settings.limits_redis_url is not None else None)
        self.tenants = Tenants(metrics, settings.default_priority, clock, shared=self._shared,
                               replicas=settings.limit_replicas)
        metrics.pools.view = self.view

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()

    def pool(self, model: str) -> Pool:
        """The pool of `model`; callers pass only models the router knows (bounded set)."""
        p = self._pools.get(model)
        if p is None:
            p = self._pools[model] = Pool(model, self.settings, self._metrics, self.clock)
            p.set_replicas(self._replicas.get(model, 0))
        return p

    def set_replicas(self, replicas: Mapping[str, int]) -> None:
        """Available replicas per model (the router's view, refreshed off the request path):
        each pool's ceiling follows its model's (`Pool.set_replicas`)."""
        self._replicas = dict(replicas)
        for name, p in self._pools.items():
            p.set_replicas(self._replicas.get(name, 0))

    def queued(self, model: str) -> int:
        p = self._pools.get(model)
        return len(p.queue) if p is not None else 0

    async def check_limits(self, tenant: Tenant, pool_name: str) -> None:
        """Charge the tenant one request; raises `RateLimited` (429) if a bucket refuses.

        With shared limits the buckets are in Redis: one round trip for a limited key; a Redis
        failure refused with 503 only when failing closed."""
        if tenant.shared is not None:
            refusal = await tenant.shared.admit(tenant.name, tenant.rpm, tenant.tpm)
        else:
            refusal = tenant.limits.admit()
        if refusal is None:
            return
        self._metrics.rejections.labels(pool_name, refusal.reason).inc()
        if refusal.reason == "unavailable":
            raise Unavailable(
                "per-key rate limits are unavailable; retry later",
                code="rate_limits_unavailable", retry_after=refusal.retry_after_s,
            )
        what = "requests" if refusal.reason == "rpm" else "tokens"
        raise RateLimited(
            f"Rate limit reached for {what} per minute on this API key; retry after "
            f"{retry_after_s(refusal.retry_after_s)}s",
            retry_after=refusal.retry_after_s,
        )

    def view(self) -> Iterator[tuple[str, int, int, int, int]]:
        for p in list(self._pools.values()):
            yield p.name, len(p.queue), p.limiter.limit, p.limiter.ceiling, p.in_flight
