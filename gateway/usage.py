"""Token usage as an upstream reports it, validated once for every path that counts it.

Usage that is not two non-negative integers is *unknown*: the answer is relayed untouched, no
tokens are counted (neither in metrics nor against a key's TPM), and
`llmserve_upstream_usage_invalid_total` counts it.
"""

from __future__ import annotations

from typing import Any

from gateway.jsonobj import json_object


def usage_counts(usage: Any, lenient: bool = False) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a `usage` object, or None when it is not a
    mapping of two non-negative integers (bools are not counts).

    `lenient`, for the endpoints other than the completions: the Responses and Messages APIs'
    names (input_tokens, output_tokens) too, and no generated tokens where the answer reports
    none (embeddings, score, rerank)."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if lenient:
        if prompt is None:
            prompt = usage.get("input_tokens")
        if completion is None:
            completion = usage.get("output_tokens", 0)
    if (type(prompt) is not int or type(completion) is not int  # type(), not isinstance: bools
            or prompt < 0 or completion < 0):
        return None
    return prompt, completion


def body_usage(body: bytes, lenient: bool = False) -> tuple[int, int] | None:
    """`usage_counts` of a whole JSON answer; None when the body is not a JSON object."""
    obj = json_object(body)
    return usage_counts(obj.get("usage"), lenient) if obj is not None else None
