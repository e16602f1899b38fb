"""Locust load test for an OpenAI-compatible endpoint (the gateway, or one pool behind it).

Every request is a streamed chat completion with `stream_options.include_usage`; the SSE events are
timed here (loadtest/metrics.py has the definitions, `vllm bench serve`'s). Locust's own row for the
request ("chat (stream)") stops at the response headers, so it is not TTFT; the rows TTFT, TPOT
and E2EL are the real ones, and the end of the run prints output tok/s and goodput.

Closed loop (N users, each sends its next request when the last one ends):

    locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 60s --stop-timeout 120 \\
        --host http://GATEWAY --model MODEL --workload chat --records-out run/a.jsonl

Open loop (Poisson arrivals at --rate req/s, whatever the server's pace; `-u 1`):

    locust -f loadtest/locustfile.py --headless -u 1 -r 1 -t 60s --stop-timeout 120 \\
        --host http://GATEWAY --model MODEL --rate 4

To compare two targets side by side, use `python -m loadtest compare` (it runs this file).
"""

from __future__ import annotations

import itertools
import json
import random
import time
from typing import Any

import gevent
from gevent.pool import Group
from locust import FastHttpUser, constant, events, task
from locust.env import Environment

from loadtest.metrics import RequestRecord, StreamTimer, parse_slos, summarize
from loadtest.workloads import WORKLOADS, Workload

_records: list[RequestRecord] = []
_sequence = itertools.count()  # request index across users: the workload's seeded order
_users = itertools.count()  # users in start order: each open-loop user's arrival seed


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="model name to request")
    parser.add_argument("--workload", default="chat", choices=WORKLOADS, help="request mix")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="max_tokens per request (0: the workload's default)")
    parser.add_argument("--api-key", default="", help="Bearer key, if the gateway requires one")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="open loop: Poisson arrivals per second (run with -u 1); 0: closed")
    parser.add_argument("--records-out", default="", help="append one JSON line per request here")
    parser.add_argument("--slo", action="append", default=[],
                        help="goodput SLO, e.g. ttft_ms=500 (repeatable)")


def _opt(env: Environment, name: str, default: Any) -> Any:
    opts = env.parsed_options
    return getattr(opts, name, default) if opts is not None else default


class _Streamer(FastHttpUser):
    """Shared request path of both load models. FastHttpUser (geventhttpclient) is locust's fastest
    client; its `readline` returns each SSE line as soon as it is in the socket buffer (its
    `iter_content` waits for whole 1 KiB blocks, which would batch events and falsify ITL)."""

    abstract = True
    # Connections per user: the open loop runs many requests from one user at once.
    concurrency = 4096

    def on_start(self) -> None:
        env = self.environment
        self.model = _opt(env, "model", "SmolLM2-135M-Instruct")
        self.workload = Workload(_opt(env, "workload", "chat"), _opt(env, "seed", 0),
                                 _opt(env, "max_tokens", 0) or None)
        key = _opt(env, "api_key", "")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.headers["Accept"] = "text/event-stream"
        self.records_out = _opt(env, "records_out", "")
        self.number = next(_users)

    def one_request(self, start_wall: float, t0: float) -> RequestRecord:
        """Send the next request of the workload; times count from `t0` (perf_counter)."""
        body = self.workload.body(self.model, next(_sequence))
        timer = StreamTimer(start_wall, t0)
        with self.client.request("POST", "/v1/chat/completions", json=body, headers=self.headers,
                                 stream=True, catch_response=True, name="chat (stream)") as resp:
            if resp.status_code == 200:
                raw = resp._response  # geventhttpclient's response: line-wise reads (see above)
                try:
                    while line := raw.readline(b"\n"):
                        if line.startswith(b"data:"):
                            timer.feed(line[5:], time.perf_counter())
                except Exception as exc:  # noqa: BLE001 - any socket failure ends this request
                    timer.fail(f"stream broken: {exc!r}", time.perf_counter())
            else:
                text = "" if resp.status_code == 0 else (resp.text or "")[:200]
                timer.fail(f"HTTP {resp.status_code}: {text or resp.error}", time.perf_counter())
            record = timer.finish(time.perf_counter())
            if record.ok:
                resp.success()
            else:
                resp.failure(record.error)
        self._report(record)
        return record

    def _report(self, r: RequestRecord) -> None:
        _records.append(r)
        fire = self.environment.events.request.fire
        if r.ok and r.ttft is not None:
            fire(request_type="SSE", name="TTFT", response_time=r.ttft * 1e3,
                 response_length=0, exception=None, context={})
            fire(request_type="SSE", name="E2EL", response_time=r.latency * 1e3,
                 response_length=r.output_tokens, exception=None, context={})
            if r.output_tokens > 1:
                fire(request_type="SSE", name="TPOT", response_time=r.tpot * 1e3,
                     response_length=0, exception=None, context={})
        if self.records_out:
            with open(self.records_out, "a") as fh:
                fh.write(r.to_json() + "\n")


class ChatUser(_Streamer):
    """Closed loop by default: one request at a time per user, the next as soon as the last one
    ends. With --rate R, open loop: each of the N users sends Poisson arrivals at R/N per second
    (together a Poisson process at R), each request in its own greenlet, never waiting for the
    previous one, and timed from its scheduled send time, so client-side delay is not hidden."""

    wait_time = constant(0)

    @task
    def stream_chat(self) -> None:
        rate = _opt(self.environment, "rate", 0.0)
        if rate > 0:
            self.open_loop(rate)
        else:
            self.one_request(time.time(), time.perf_counter())

    def open_loop(self, rate: float) -> None:
        env = self.environment
        if getattr(self, "_done", False):  # arrivals end with the run; wait for locust to stop
            gevent.sleep(0.5)
            return
        users = max(1, _opt(env, "num_users", 1) or 1)
        run_time = _opt(env, "run_time", None)
        rng = random.Random(f"arrivals:{_opt(env, 'seed', 0)}:{self.number}")
        group = Group()
        t0, wall0 = time.perf_counter(), time.time()
        end = t0 + run_time if run_time else float("inf")
        due = t0
        while True:
            due += rng.expovariate(rate / users)
            if due >= end:
                break
            gevent.sleep(max(0.0, due - time.perf_counter()))
            group.spawn(self.one_request, wall0 + (due - t0), due)
        group.join()  # in-flight requests finish (locust's --stop-timeout must cover them)
        self._done = True

@events.test_stop.add_listener
def _summary(environment: Environment, **_: Any) -> None:
    if not _records:
        return
    s = summarize(_records, parse_slos(_opt(environment, "slo", [])))
    print("loadtest summary: " + json.dumps({k: s[k] for k in (
        "requests", "errors", "output_tokens", "duration_s", "output_tok_s", "req_s",
        "ttft_ms", "tpot_ms", "itl_ms", "token_sources") if k in s}
        | ({"goodput_req_s": s["goodput_req_s"]} if "goodput_req_s" in s else {})), flush=True)
