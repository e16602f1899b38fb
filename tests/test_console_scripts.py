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
# Every package with a __main__.py is a CLI.
CLI_PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__main__.py"))


def _entry(target: str) -> Callable[[list[str]], Any]:
    module, _, name = target.partition(":")
    fn: Callable[[list[str]], Any] = getattr(importlib.import_module(module), name)
    return fn


def test_every_cli_package_has_a_script() -> None:
    packages = {target.split(".")[0] for target in SCRIPTS.values()}
    assert packages == set(CLI_PACKAGES)
    # One name per CLI, the one it calls itself: no aliases.
    assert all(name.startswith("llmserve-") for name in SCRIPTS)
    assert len(SCRIPTS) == len(CLI_PACKAGES)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_exits_0_under_the_scripts_name(script: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _entry(SCRIPTS[script])(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {script} ")
