"""Seeded request workloads: the same seed gives the same sequence of request bodies.

- chat: short questions, short answers (max_tokens 128);
- long-prompt: prefill-heavy, ~1,500-word prompts and 32-token answers;
- long-output: decode-heavy, a short prompt and exactly `max_tokens` (512) tokens through vLLM's
  `ignore_eos` (a server that rejects the field answers 400: use another workload there);
- shared-prefix: one long system prompt common to every request (prefix caching's case) and a short
  varying question.

Prompts are made of words, not token ids, so they are valid for any tokenizer; lengths in tokens
are therefore approximate, and the report counts what the server says (usage).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

WORKLOADS = ("chat", "long-prompt", "long-output", "shared-prefix")

_TOPICS = ["pipeline parallelism", "tensor parallelism", "a KV cache", "GPU memory bandwidth",
           "continuous batching", "speculative decoding", "prefix caching", "quantization",
           "the attention mechanism", "a load balancer", "Kubernetes", "flow control"]
_ASKS = ["Explain {} in two sentences.", "What is {} good for?", "List three facts about {}.",
         "Write a haiku about {}.", "Compare {} with a simpler alternative.",
         "When should an engineer avoid {}?"]
_WORDS = ("alpha", "beta", "gamma", "delta", "model", "token", "layer", "cache", "memory",
          "tensor", "pipeline", "rank", "node", "batch", "queue", "stream", "decode", "prefill",
          "latency", "throughput", "kernel", "matrix", "vector", "weight", "shard", "replica",
          "gateway", "request", "answer", "server", "client")


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int = 0
    max_tokens: int | None = None  # None: the workload's default

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"--workload {self.name!r}: expected one of {', '.join(WORKLOADS)}")

    @property
    def default_max_tokens(self) -> int:
        return {"chat": 128, "long-prompt": 32, "long-output": 512, "shared-prefix": 64}[self.name]

    def body(self, model: str, index: int) -> dict[str, Any]:
        """The `index`-th request of this workload (a chat completion, streamed with usage)."""
        rng = random.Random(f"{self.name}:{self.seed}:{index}")
        question = rng.choice(_ASKS).format(rng.choice(_TOPICS))
        messages: list[dict[str, str]]
        extra: dict[str, Any] = {}
        if self.name == "long-prompt":
            text = " ".join(rng.choice(_WORDS) for _ in range(1500))
            messages = [{"role": "user", "content": f"{text}\n\nSummarise the text above. "
                                                    f"{question}"}]
        elif self.name == "shared-prefix":
            prefix_rng = random.Random(f"prefix:{self.seed}")
            system = " ".join(prefix_rng.choice(_WORDS) for _ in range(800))
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": question}]
        else:
            messages = [{"role": "user", "content": question}]
        if self.name == "long-output":
            # Fixed-length answers: decode cost per request is the same on both targets.
            extra = {"ignore_eos": True}
        return {
            "model": model,
            "messages": messages,
            "max_tokens": self.max_tokens or self.default_max_tokens,
            "temperature": 0.0,
            "seed": rng.randrange(2**31),
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
