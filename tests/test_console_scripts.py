"""Every CLI has a console script in pyproject.toml, named as the CLI names itself in its usage
line and its errors (`llmserve-gateway: error: ...`), and its --help exits 0."""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
    "scripts"]
# Older names kept for the docs and scripts that use them: name -> the CLI's own name.
ALIASES = {"model_store": "llmserve-model-store"}
# Every package with a __main__.py is a CLI.
CLI_PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__main__.py"))


def _entry(target: str) -> Callable[[list[str]], Any]:
    module, _, name = target.partition(":")
    fn: Callable[[list[str]], Any] = getattr(importlib.import_module(module), name)
    return fn


def test_every_cli_package_has_a_script() -> None:
    packages = {target.split(".")[0] for target in SCRIPTS.values()}
    assert packages == set(CLI_PACKAGES)
    assert all(name.startswith("llmserve-") or name in ALIASES for name in SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_exits_0_under_the_scripts_name(script: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _entry(SCRIPTS[script])(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {ALIASES.get(script, script)} ")
