"""The gateway's imports run one way: api, then flow, then routing, then transport, then the base
(settings, errors, metrics); the modules that assemble the process (app,
server, edge, cli) sit above them all. No lower layer imports a higher one, and nothing cycles."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"

# Higher imports lower, never the reverse.
RANKS = {"api": 4, "flow": 3, "routing": 2, "transport": 1}
ASSEMBLY = {"app", "server", "edge", "cli", "__main__", "epp"}


def rank(module: str) -> int:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in RANKS:  # a layer's package or a module in it
        return RANKS[parts[1]]
    return 5 if len(parts) >= 2 and parts[1] in ASSEMBLY else 0  # edge: a package


@functools.cache  # read once: every parametrized case below looks at the same tree
def imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            deps.update(n for n in names if n == "gateway" or n.startswith("gateway."))
        graph[module] = deps
    return graph


def test_the_graph_is_read() -> None:
    graph = imports()
    # The check below means nothing if the walk found nothing: known edges must be there.
    assert "gateway.settings" in graph["gateway.transport.h1"]
    assert "gateway.flow.admission" in graph["gateway.api.forward"]
    assert rank("gateway.api.forward") == 4 and rank("gateway.transport.h1") == 1
    assert rank("gateway.settings") == 0 and rank("gateway.server") == 5


@pytest.mark.parametrize("module", sorted(imports()))
def test_no_module_imports_a_higher_layer(module: str) -> None:
    higher = sorted(d for d in imports()[module] if rank(d) > rank(module))
    assert not higher, f"{module} (layer {rank(module)}) imports {higher}"

