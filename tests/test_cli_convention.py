"""Every llmserve command fails the same way (`<prog>: error: <message>` on one line, exit 2 for
bad usage), and says so in one place: model_store/cli_error.py. No other module of the packages
spells the line out (their docstrings may describe it)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "worker", "model_store", "loadtest", "devstack", "bench", "deploy")
HOME = REPO / "model_store" / "cli_error.py"


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def error_lines_spelled_out(path: Path) -> list[int]:
    """Lines of `path` whose string literals (f-strings' parts included) hold ": error:"."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and id(node) not in skip and ": error:" in node.value})


def test_the_error_line_is_spelled_out_in_one_place() -> None:
    found = {str(p.relative_to(REPO)): lines
             for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             if (lines := error_lines_spelled_out(p))}
    assert list(found) == [str(HOME.relative_to(REPO))], found
