"""The adaptive concurrency limit of one pool: AIMD on the engines' measured TTFT.

Signal: each streamed request's upstream TTFT (dispatch -> first byte): the engine's own queueing
plus prefill, without the gateway's queue (which the limit itself causes). Engines reporting
waiting requests or a nearly full KV cache (flow/pressure.py) count as a missed target too.

- Target met while the limit is in use: grow by `GROWTH * (1 - latency / target)` per sample,
  never less than `1 / limit` (+1 per round trip of the whole window, right at the target).
  Multi-second streams make a window take seconds, so +1 per window alone would be far too slow.
- Target missed: multiplicative decrease by the overshoot (`target / latency`, between half and
  `backoff`), at most once per round trip: samples dispatched before the last cut describe the
  old limit and are ignored.
- Slow start (TCP's): from the start and after a pause, a sample under `SLOW_START_BELOW`
  of the target adds two slots per streamed first token (the stream keeps its slot, and one
  more) or one per whole answer (it frees its own), so the limit doubles every round trip (the
  pool may hold a sample's slots back, `hold`, and add them later, `climb`). It
  ends at the first cut, at engine pressure, or at the first sample at `SLOW_START_BELOW` of the
  target or later, which also cuts the limit by how much slower than the climb's fastest sample
  it came back (Netflix concurrency-limits' gradient, within `GRADIENT_TOLERANCE` and
  `GRADIENT_FLOOR`; never below the limit it resumed from): the climb overshoots by up to a round trip of growth, which would otherwise
  sit in the engines' queue for another round trip.
- Only evidence of full engines cuts the limit or ends slow start: a first token late (at half the
  target, or over it) while other requests were in flight with it (`QUEUEING`), or the engines'
  own queue (flow/pressure.py). A late first token with the pool otherwise empty is its own
  prompt's prefill or a busy host: no lower limit would make it faster.
- Whole (non-streamed) answers have no first token, and their latency grows with their length and
  their prompt (a one-token answer to a long prompt is all prefill): they can only grow the limit,
  never cut it. Each is judged per generated token against the best per-token latency seen lately
  (the gradient again): at that best it counts as no latency, at `WHOLE_TOLERANCE` x as right at
  the target, and beyond that it teaches nothing.
- Idle time teaches nothing about capacity: the limit stays. After a pause (the pool empty) slow
  start resumes from it and forgets the climb's fastest first token (the pace of a lone request
  says nothing about a burst's, whose prefills share the engines' steps).
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

# Limit added per good sample with no latency at all (half that at half the target).
GROWTH = 0.25
# Slow start adds slots per sample below this share of the target.
SLOW_START_BELOW = 0.5
# A late first token is evidence of full engines only if at least this many requests (itself
# included) were in flight when it came back.
QUEUEING = 2
# A whole answer this many times slower per token than the best seen lately misses the target.
WHOLE_TOLERANCE = 2.0
# Each whole answer moves the best this share of the way toward itself: a best set in a quiet
# moment (a cache hit, a tiny prompt) must not brand every later answer as slow.
BEST_DRIFT = 0.005
# The best per-token latency is never taken below this: faster than 5 ms a token is the gateway's
# and the network's own jitter (a near-free upstream, a busy gateway core), not an engine's decode.
MIN_BEST_PER_TOKEN_S = 0.005
# Slow start ends at a sample this many times slower than its fastest, cut by the ratio (a
# first token twice the fastest is still the engines' own pace: batching, a longer prompt).
GRADIENT_TOLERANCE = 2.0
# That cut never takes more than this share off: one slow first token (a long prompt, a busy
# host) must not halve a limit that the climb's other samples found good.
GRADIENT_FLOOR = 0.7


class AimdLimiter:
    """Bounds (`floor <= initial <= ceiling`, `0 < backoff < 1`) are FlowSettings' to validate."""

    __slots__ = ("_backoff", "_base", "_best_per_token", "_clock", "_first_token", "_floor",
                 "_last_cut", "_limit", "ceiling", "limit", "slow_start", "target_s")

    def __init__(
        self, *, initial: int, floor: int, ceiling: int, target_s: float, backoff: float = 0.9,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._limit = float(initial)
        self._base = float(initial)  # the limit slow start last resumed from
        # True while the limit climbs from a start or a pause: no first token yet at half the
        # target or later, and nothing cut. False once the engines have shown their capacity.
        self.slow_start = True
        self._floor = floor
        self.ceiling = ceiling
        self.target_s = target_s
        self._backoff = backoff
        self._clock = clock
        self._last_cut = -1e18
        self._best_per_token = 0.0  # whole answers: best seconds per token lately (0: none yet)
        self._first_token = 0.0  # slow start: fastest time from dispatch to a sample (0: none yet)
        self.limit = initial  # the integer the admission check reads

    @property
    def first_token_s(self) -> float:
        """In slow start, the fastest time from dispatch to a sample since the start or the last
        pause (0: none yet): how soon a request in flight should add its slots."""
        return self._first_token if self.slow_start else 0.0

    def on_sample(self, latency_s: float, dispatched_at: float, in_flight: int, *,
                  turnover_s: float | None = None, paced: bool = True,
                  hold: bool = False) -> float:
        """One request's upstream TTFT; `in_flight` counts admitted requests at that moment
        (itself included); `turnover_s` is the time a whole answer took to come back (it is
        judged on another scale, `latency_s`, and may only grow the limit). `paced`: the
        request shared the engines' prefill with others, so its time may set the climb's pace
        (`first_token_s`); a request sent while no other awaited its first token was prefilled
        alone, faster than any of a burst's can be. `hold`: in slow start, do not add the
        sample's slots but return them (the caller adds them later with `climb`, or never);
        else returns 0."""
        late = latency_s >= SLOW_START_BELOW * self.target_s
        if late and (turnover_s is not None or in_flight < QUEUEING):
            return 0.0  # no evidence of full engines: a whole answer, or a request alone
        if self.slow_start:
            took = latency_s if turnover_s is None else turnover_s
            if late:
                # The engines queue enough to show in the first token: the limit met their capacity.
                self.slow_start = False
                if self._first_token > 0.0 and latency_s <= self.target_s:  # a miss cuts below
                    self._set(max(min(self._base, self._limit), self._limit * min(
                        1.0, max(GRADIENT_FLOOR, GRADIENT_TOLERANCE * self._first_token / took))))
            elif paced and (self._first_token <= 0.0 or took < self._first_token):
                self._first_token = took
        if latency_s > self.target_s:
            if dispatched_at >= self._last_cut:
                self._cut(self.target_s / latency_s)
            return 0.0
        # Grow only when the limit binds: an idle pool proves nothing about a higher limit.
        if in_flight * 2 >= self.limit:
            if self.slow_start:
                # Doubles per round trip: a stream keeps its slot, a whole answer frees its own.
                slots = 1.0 if turnover_s is not None else 2.0
                if hold:
                    return slots
                self._set(self._limit + slots)
                return 0.0
            room = 1.0 - latency_s / self.target_s
            self._set(self._limit + max(1.0 / self._limit, GROWTH * room))
        return 0.0

    def climb(self, slots: float) -> None:
        """Add slots a sample earned in slow start and `on_sample` held back (none after it)."""
        if self.slow_start:
            self._set(self._limit + slots)

    def on_whole_sample(
        self, latency_s: float, tokens: int, dispatched_at: float, in_flight: int, *,
        paced: bool = True,
    ) -> None:
        """One whole answer: `latency_s` from dispatch to its last byte, `tokens` generated
        (`paced` as for `on_sample`)."""
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
        self.on_sample(self.target_s * (ratio - 1.0) / (WHOLE_TOLERANCE - 1.0), dispatched_at,
                       in_flight, turnover_s=latency_s, paced=paced)

    def on_idle(self) -> None:
        """The pool emptied and a request comes: slow start resumes from the limit it has (idle
        time is no evidence either way), without the pace of the last climb."""
        self.slow_start = True
        self._first_token = 0.0
        self._base = self._limit

    def set_ceiling(self, ceiling: int) -> None:
        """A new ceiling, when the pool's available replicas change: a lower one clamps the limit
        at once (the capacity behind it is gone); a higher one only lets it grow further. Never
        below the floor."""
        ceiling = max(ceiling, self._floor)
        if ceiling != self.ceiling:
            self.ceiling = ceiling
            self._set(self._limit)

    def on_pressure(self) -> None:
        """The engines report queued requests or a full KV cache: back off (once per round)."""
        if self._clock() - self._last_cut >= self.target_s:
            self._cut(self._backoff)

    def _cut(self, ratio: float) -> None:
        self.slow_start = False
        self._last_cut = self._clock()
        self._set(self._limit * min(self._backoff, max(0.5, ratio)))

    def _set(self, value: float) -> None:
        self._limit = min(float(self.ceiling), max(float(self._floor), value))
        self.limit = int(self._limit + 1e-9)  # 1/n added n times must reach the next integer
