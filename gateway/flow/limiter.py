"""The adaptive concurrency limit of one pool: AIMD on the engines' measured TTFT.

Signal: each streamed request's upstream TTFT (dispatch -> first byte), i.e. the engine's own
queueing plus prefill, without the gateway's queue (which the limit itself causes). Engines that
report waiting requests or a nearly full KV cache (scraped from their /metrics) count as a missed
target too: work is piling up inside them, which is what the limit exists to prevent.

- Target met while the limit is actually in use: increase in proportion to the headroom,
  `GROWTH * (1 - latency / target)` per sample, never less than `1 / limit` (classic additive
  increase, +1 per round trip of the whole window, right at the target). Plain +1 per window is
  far too slow on real engines: with multi-second streams a window takes seconds, and the limit
  crept while TTFT sat at half the target and the offered load was refused
  (docs/benchmarks.md, flow control).
- Target missed: multiplicative decrease, scaled by the overshoot (`target / latency`, never below
  half, never above `backoff`), at most once per round trip: samples from requests dispatched
  before the last decrease describe the old limit and are ignored.
- Slow start (TCP's): from the start, and again after an idle spell, a sample far below the target
  (under `SLOW_START_BELOW` of it) adds slots so that the limit doubles every round trip instead
  of creeping: two per streamed first token (the stream keeps the slot it holds, and one more),
  one per whole answer (which frees its own slot as it ends). Slow start ends at the first cut,
  at engine pressure, or at the first sample at `SLOW_START_BELOW` of the target or later: the
  engines now queue enough to show it, so the limit has met their capacity. That sample also cuts
  the limit by how much slower than the climb's fastest sample it came back, tolerating
  `GRADIENT_TOLERANCE` x (Netflix concurrency-limits' gradient), keeping at least
  `GRADIENT_FLOOR` of it: the climb overshoots by up to a round trip of growth, and waiting for a
  miss of the target itself would leave that overshoot in the engines' queue for another round
  trip.
- Whole (non-streamed) answers, the other request class, have no TTFT: their latency is the whole
  generation, and grows with its length. Each is judged per generated token against the best
  per-token latency this pool has seen lately (Netflix concurrency-limits' gradient: latency
  against its own unloaded minimum, not a fixed target): at that best it counts as a sample with
  no latency at all, at `WHOLE_TOLERANCE` x the best as one right at the target, beyond as a miss.
  Without it a pool serving only whole answers never left its starting limit.
- Idle: a limit learnt under load says little after a quiet spell. When a pool has been empty for
  `IDLE_S` x target, the limit halves per such spell down to its starting value, and slow start
  resumes: a burst after the pause ramps up again in a few round trips.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

# Limit added per good sample with no latency at all (half that at half the target): slots grow
# about GROWTH x the admission rate while there is room, e.g. +1.4/s at 5.5 admissions/s.
GROWTH = 0.25
# Slow start adds a slot per sample below this share of the target.
SLOW_START_BELOW = 0.5
# An empty pool for this many targets counts as idle.
IDLE_S = 10.0
# A whole answer this many times slower per token than the best seen lately misses the target.
WHOLE_TOLERANCE = 2.0
# Each whole answer moves the best this share of the way toward itself: a best set in a quiet
# moment (a cache hit, a tiny prompt) must not brand every later answer as slow.
BEST_DRIFT = 0.005
# The best per-token latency is never taken below this: answers faster than 5 ms a token are the
# gateway's and the network's own jitter (a near-free upstream, a busy gateway core), not an
# engine's decode, and against a best of microseconds every scheduling hiccup read as a 2x miss and
# cut the limit (503s from a healthy upstream in tests/gateway/flow/test_shared_limits.py).
MIN_BEST_PER_TOKEN_S = 0.005
# Slow start ends at a sample this many times slower than its fastest, cut by the ratio (a
# first token twice the fastest is still the engines' own pace: batching, a longer prompt).
GRADIENT_TOLERANCE = 2.0
# That cut never takes more than this share off: one slow first token (a long prompt, a busy
# host) must not halve a limit that the climb's other samples found good.
GRADIENT_FLOOR = 0.7


class AimdLimiter:
    __slots__ = ("_backoff", "_best_per_token", "_ceiling", "_clock", "_first_token", "_floor",
                 "_initial", "_last_cut", "_limit", "_slow_start", "_target", "limit")

    def __init__(
        self, *, initial: int, floor: int, ceiling: int, target_s: float, backoff: float = 0.9,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        if not 1 <= floor <= initial <= ceiling:
            raise ValueError("AimdLimiter: need 1 <= floor <= initial <= ceiling")
        if target_s <= 0 or not 0 < backoff < 1:
            raise ValueError("AimdLimiter: need target_s > 0 and 0 < backoff < 1")
        self._limit = float(initial)
        self._initial = initial
        self._slow_start = True
        self._floor = floor
        self._ceiling = ceiling
        self._target = target_s
        self._backoff = backoff
        self._clock = clock
        self._last_cut = -1e18
        self._best_per_token = 0.0  # whole answers: best seconds per token lately (0: none yet)
        self._first_token = 0.0  # slow start: fastest time from dispatch to a sample (0: none yet)
        self.limit = initial  # the integer the admission check reads

    @property
    def target_s(self) -> float:
        return self._target

    @property
    def slow_start(self) -> bool:
        """True while the limit is still climbing from a start or a pause: no first token has yet
        come back at half the target or later, and nothing was cut. False once the engines have
        shown their capacity."""
        return self._slow_start

    @property
    def first_token_s(self) -> float:
        """In slow start, the fastest time from dispatch to a sample since the start or the last
        pause (0: none yet): how soon a request in flight should add its slots."""
        return self._first_token if self._slow_start else 0.0

    def on_sample(self, latency_s: float, dispatched_at: float, in_flight: int, *,
                  turnover_s: float | None = None) -> None:
        """One request's upstream TTFT; `in_flight` counts admitted requests at that moment;
        `turnover_s` is the time the sample took to come back when it differs from `latency_s`
        (a whole answer's, judged on another scale)."""
        if self._slow_start:
            took = latency_s if turnover_s is None else turnover_s
            if latency_s >= SLOW_START_BELOW * self._target:
                # The engines queue enough to show in the first token: the limit has met their
                # capacity. Slow start ends with a cut by how much slower than the climb's
                # fastest sample this one came back (Netflix's gradient), to no less than
                # `GRADIENT_FLOOR` of the limit.
                self._slow_start = False
                if self._first_token > 0.0 and latency_s <= self._target:  # a miss cuts below
                    self._set(self._limit * min(1.0, max(GRADIENT_FLOOR, GRADIENT_TOLERANCE
                                                         * self._first_token / took)))
            elif self._first_token <= 0.0 or took < self._first_token:
                self._first_token = took
        if latency_s > self._target:
            if dispatched_at >= self._last_cut:
                self._cut(self._target / latency_s)
            return
        # Grow only when the limit binds: an idle pool proves nothing about a higher limit.
        if in_flight * 2 >= self.limit:
            if self._slow_start:
                # A stream keeps its slot after its first token: each adds the slot it holds
                # and one more, so the limit doubles every round trip. A whole answer's sample
                # comes as it ends and frees its own slot: one more doubles it.
                self._set(self._limit + (1.0 if turnover_s is not None else 2.0))
                return
            room = 1.0 - latency_s / self._target
            self._set(self._limit + max(1.0 / self._limit, GROWTH * room))

    def on_whole_sample(
        self, latency_s: float, tokens: int, dispatched_at: float, in_flight: int
    ) -> None:
        """One whole answer: `latency_s` from dispatch to its last byte, `tokens` generated."""
        per_token = latency_s / (tokens + 1)  # +1: the prefill, however short the answer
        best = self._best_per_token
        if best <= 0.0 or per_token < best:
            best = per_token
        else:
            best += (per_token - best) * BEST_DRIFT
        self._best_per_token = best
        if best <= 0.0:
            return
        ratio = max(1.0, per_token / max(best, MIN_BEST_PER_TOKEN_S))
        # Mapped onto the streamed scale: the best is no latency, WHOLE_TOLERANCE x is the target.
        self.on_sample(self._target * (ratio - 1.0) / (WHOLE_TOLERANCE - 1.0), dispatched_at,
                       in_flight, turnover_s=latency_s)

    def on_idle(self, idle_s: float) -> None:
        """The pool has been empty for `idle_s`: decay toward the starting limit, slow start again."""
        spells = int(idle_s / (IDLE_S * self._target))
        if spells <= 0:
            return
        self._slow_start = True
        self._first_token = 0.0  # the pace before the pause says little about the next burst
        if self._limit > self._initial:
            self._set(max(float(self._initial), self._limit / 2.0 ** min(spells, 30)))

    def set_ceiling(self, ceiling: int) -> None:
        """A new ceiling, when the pool's available replicas change: a lower one clamps the limit
        at once (the capacity behind it is gone); a higher one only lets it grow further. Never
        below the floor."""
        ceiling = max(ceiling, self._floor)
        if ceiling != self._ceiling:
            self._ceiling = ceiling
            self._set(self._limit)

    @property
    def ceiling(self) -> int:
        return self._ceiling

    def on_pressure(self) -> None:
        """The engines report queued requests or a full KV cache: back off (once per round)."""
        if self._clock() - self._last_cut >= self._target:
            self._cut(self._backoff)

    def _cut(self, ratio: float) -> None:
        self._slow_start = False
        self._last_cut = self._clock()
        self._set(self._limit * min(self._backoff, max(0.5, ratio)))

    def _set(self, value: float) -> None:
        self._limit = min(float(self._ceiling), max(float(self._floor), value))
        self.limit = int(self._limit + 1e-9)  # 1/n added n times must reach the next integer
