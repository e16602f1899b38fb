"""Locust load test for an OpenAI-compatible endpoint (the gateway, or one pool behind it).

Each simulated user streams chat completions and reports, besides locust's request stats:
- `TTFT` (time to the first content event) as its own locust entry,
- `tokens` with the generated token count as the "response length", so locust's per-second
  table shows tokens/s for it.

TP pool against PP pool (deploy/helm values-tp-vs-pp.yaml serves the same model under two names):

    locust -f loadtest/locustfile.py --headless -u 32 -r 8 -t 2m --host http://GATEWAY \\
        --model llama-70b-tp --csv run/tp
    locust -f loadtest/locustfile.py --headless -u 32 -r 8 -t 2m --host http://GATEWAY \\
        --model llama-70b-pp --csv run/pp

and compare the TTFT and tokens rows of run/tp_stats.csv and run/pp_stats.csv.
"""

from __future__ import annotations

import json
import time
from typing import Any

from locust import HttpUser, between, events, task
from locust.env import Environment

PROMPTS = [
    "Explain pipeline parallelism in two sentences.",
    "What is the capital of France?",
    "Write a haiku about GPUs.",
    "List three uses of a KV cache.",
]


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="model name to request")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_tokens per request")
    parser.add_argument("--api-key", default="", help="Bearer key, if the gateway requires one")


class ChatUser(HttpUser):
    wait_time = between(0.0, 0.2)

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.model = opts.model if opts else "SmolLM2-135M-Instruct"
        self.max_tokens = opts.max_tokens if opts else 128
        key = opts.api_key if opts else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.n = 0

    @task
    def stream_chat(self) -> None:
        self.n += 1
        body = {
            "model": self.model, "stream": True, "max_tokens": self.max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": PROMPTS[self.n % len(PROMPTS)]}],
        }
        env: Environment = self.environment
        t0 = time.perf_counter()
        ttft: float | None = None
        tokens = 0
        with self.client.post("/v1/chat/completions", json=body, headers=self.headers,
                              stream=True, catch_response=True, name="chat (stream)") as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            for line in resp.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    resp.failure(f"in-band error: {chunk['error'].get('message')}")
                    return
                if ttft is None and chunk.get("choices"):
                    ttft = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
            resp.success()
        if ttft is not None:
            env.events.request.fire(request_type="METRIC", name="TTFT", response_time=ttft * 1e3,
                                    response_length=0, exception=None, context={})
        env.events.request.fire(request_type="METRIC", name="tokens",
                                response_time=(time.perf_counter() - t0) * 1e3,
                                response_length=tokens, exception=None, context={})
