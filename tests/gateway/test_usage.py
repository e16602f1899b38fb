from __future__ import annotations

import pytest

from gateway.usage import usage_counts


@pytest.mark.parametrize("usage", [
    "abc", None, [], {}, {"prompt_tokens": 5}, {"prompt_tokens": "5", "completion_tokens": 1},
    {"prompt_tokens": -1, "completion_tokens": 1}, {"prompt_tokens": 1.5, "completion_tokens": 1},
    {"prompt_tokens": True, "completion_tokens": 1},
])
def test_anything_but_two_non_negative_integers_is_unknown(usage: object) -> None:
    assert usage_counts(usage) is None


def test_counts() -> None:
    assert usage_counts({"prompt_tokens": 0, "completion_tokens": 7, "total_tokens": 7}) == (0, 7)
