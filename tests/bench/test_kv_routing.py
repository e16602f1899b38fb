"""bench.kv_routing sizes the engines' context to their small KV caches as vLLM requires."""

from __future__ import annotations

import sys

import pytest

from bench.kv_routing import fitting_model_len, main
from tests.cli import EXIT_USAGE, usage_error


def test_the_model_len_fits_in_all_blocks_but_the_null_block() -> None:
    # vLLM 0.32 refused 16 blocks of 128 with --max-model-len 2048: "estimated maximum model
    # length is 1920" (one block is its null block).
    assert fitting_model_len(16, None) == 15 * 128
    assert fitting_model_len(17, 2048) == 2048
    assert fitting_model_len(16, 1024) == 1024


def test_a_model_len_the_cache_cannot_hold_is_refused_before_any_engine_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/kv_routing.py", "--kv-blocks", "16",
                                      "--max-model-len", "2048"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == EXIT_USAGE
    message = usage_error(capsys.readouterr().err, "python -m bench.kv_routing")
    assert "--kv-blocks >= 17" in message and "at most 1920" in message


def test_a_cache_of_one_block_is_refused(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/kv_routing.py", "--kv-blocks", "1"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == EXIT_USAGE
    assert "null block" in usage_error(capsys.readouterr().err, "python -m bench.kv_routing")
