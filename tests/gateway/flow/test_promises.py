"""Flow control's two promises, held together on virtual time (tests/gateway/flow/simulation.py).

1. Under overload, admitted requests meet the TTFT target: a cold gateway meets 140, 180 and 280
   closed-loop users (each sends about one request a second: 2x, 2.6x and 4x what the engine
   serves; their first requests at once or spread) in front of one engine with 8 sequence slots (first token 50 ms after a slot is
   taken, then 32 tokens 2 ms apart: ~70 streams/s), TTFT target 0.4 s, queue timeout 0.1 s.
2. A cold gateway refuses nothing that healthy engines serve: open-loop arrivals at 250 and
   400 req/s in front of engines with room for all (first token at 100 ms, 64 tokens 20 ms apart),
   with the default settings; at 600 req/s, a few (the door's promise stops short of slow start's
   whole growth, see admission.PROMISE).

Each is one deterministic run of the real admission code on recorded arrivals (seeded), so the
bounds below are exact for this code and this machine-independent: a change of the door's
arithmetic that breaks either promise fails here, in about a second.
"""

from __future__ import annotations

import pytest

from gateway.flow.admission import OVERDUE, OVERDUE_TARGET, PROMISE
from gateway.settings import FlowSettings
from tests.gateway.flow.simulation import Engine, closed_loop, open_loop

SLOTS_8 = Engine(slots=8, first_token_s=0.05, token_s=0.002, tokens=32)
REAL_PACE = Engine(slots=0, first_token_s=0.1, token_s=0.02, tokens=64)
OVERLOAD = FlowSettings(ttft_target_s=0.4, queue_timeout_s=0.1)


# When the users' first requests reach the gateway: all at once, one by one over 100 ms (as a load
# generator's connections reach it: nobody is overtaken in the engine's first-come-first-served
# queue, yet it holds all but 8 of those sent with the first ones it answers), or spread over a
# whole think time.
STARTS = pytest.mark.parametrize("start_s", [0.0, 0.1, 1.0],
                                 ids=["burst", "one-by-one-100ms", "spread"])


@pytest.mark.parametrize("users", [140, 180, 280])
@STARTS
def test_admitted_ttft_stays_within_the_target_under_overload(users: int, start_s: float) -> None:
    # The engine without the gateway, with the same users and the same starts.
    engine = closed_loop(SLOTS_8, None, users=users, think_s=1.0, duration_s=30, start_s=start_s)
    gw = closed_loop(SLOTS_8, OVERLOAD, users=users, think_s=1.0, duration_s=30, start_s=start_s)
    # It is an overload: the engine alone keeps its p99 waiting past twice the target.
    assert engine.ttft_p99() > 2 * OVERLOAD.ttft_target_s
    assert gw.ttft_p99() <= 1.25 * OVERLOAD.ttft_target_s
    assert gw.ttft_p99() <= 0.5 * engine.ttft_p99()
    assert gw.goodput() >= 0.95 * engine.goodput()
    refused = gw.refused
    assert len(refused) > 1000
    assert all(o.status == 503 and o.retry_after is not None and o.retry_after >= 1
               for o in refused)
    # Refusals are decided at the door, so their p99 is immediate. Only a cold start waits for
    # some: those queued on slow start's promise, refused once it is seen broken, never after
    # the queue's deadline.
    waited = [o.answered_s for o in refused if o.answered_s > 0.0]
    assert all(o.sent < 1.0 for o in refused if o.answered_s > 0.0)  # the first second's
    if start_s == 0.0:
        # All at once: at most the promise's queue of the first round trip, refused when the
        # requests sent with the first answered ones are overdue (1.5 first tokens).
        assert len(waited) <= PROMISE * OVERLOAD.initial_limit
        overdue_s = max(OVERDUE * SLOTS_8.first_token_s,
                        OVERDUE_TARGET * (OVERLOAD.ttft_target_s - OVERLOAD.queue_timeout_s))
        assert max(waited, default=0.0) <= overdue_s + 1e-9
    else:
        assert max(waited, default=0.0) <= OVERLOAD.queue_timeout_s + 1e-9


@pytest.mark.parametrize("rate", [250, 400, 600])
def test_a_cold_gateway_refuses_nothing_healthy_engines_serve(rate: float) -> None:
    for seed in (1, 2, 3):
        run = open_loop(REAL_PACE, FlowSettings(), rate=rate, duration_s=4, seed=seed)
        assert len(run.outcomes) > 3 * rate
        if rate <= 400:
            assert run.refused == []
        else:  # beyond the promise's reach: a few of the first round trip's arrivals
            assert len(run.refused) <= 0.005 * len(run.outcomes)
        # Nor kept waiting: the door queues a cold burst about one round trip at most.
        assert run.ttft_p99() <= REAL_PACE.first_token_s + 0.075
