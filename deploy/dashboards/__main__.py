"""python -m deploy.dashboards [--check]: write (or compare) the chart's dashboard JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.dashboards import engines, overview, tp_vs_pp
from deploy.dashboards.common import Dashboard, to_json

OUT = Path(__file__).resolve().parents[1] / "helm" / "llmserve" / "dashboards"
# File name -> dashboard; the chart makes one ConfigMap per file.
DASHBOARDS = {
    "llmserve-overview.json": overview.dashboard,
    "llmserve-engines.json": engines.dashboard,
    "llmserve-tp-vs-pp.json": tp_vs_pp.dashboard,
}


def all_dashboards() -> dict[str, Dashboard]:
    return {name: make() for name, make in DASHBOARDS.items()}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.dashboards", description=__doc__)
    p.add_argument("--check", action="store_true", help="fail if the JSON on disk is stale")
    args = p.parse_args()
    stale = []
    for name, d in all_dashboards().items():
        path, text = OUT / name, to_json(d)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in DASHBOARDS)
    if args.check and (stale or extra):
        print(f"dashboards out of date: {', '.join(stale + extra)}; run python -m deploy.dashboards",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
