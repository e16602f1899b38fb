"""Draw each dashboard's panels from recorded query results, one PNG per dashboard.

    python -m deploy.dashboards.render RESULTS.json [--out docs]

RESULTS.json is what tests/e2e/test_observability.py keeps (LLMSERVE_DASHBOARD_RESULTS=...): the
Prometheus answers to every panel query over a load run. The pictures follow the dashboards'
layout (rows of panels, Grafana's legend formats and units, threshold lines) so a reader sees what
Grafana would. A panel whose queries read metrics the results list as synthetic (the GPU panels:
no GPU where the test runs) says so in its title.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from model_store import cli_error

COLUMNS = 3
ROW_HEIGHT = 4.6  # inches: plot, axis labels and a legend of up to three lines
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: `{{label}}` from the series' labels; none: the label set."""
    if not fmt:
        shown = {k: v for k, v in labels.items() if k not in ("__name__", "job", "instance")}
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    # A `... or vector(0)` fallback has no labels: Grafana shows an empty name, we say "none".
    return _LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), fmt).strip() or "none"


def scale(unit: str, peak: float) -> tuple[float, str]:
    """(factor, axis label) for a Grafana unit."""
    if unit == "s":
        return (1e3, "ms") if peak < 1 else (1.0, "s")
    if unit == "percentunit":
        return 100.0, "%"
    if unit == "mbytes":
        return (1 / 1024, "GiB") if peak >= 1024 else (1.0, "MiB")
    return 1.0, {"reqps": "req/s", "ops": "ops/s", "short": "", "none": "", "percent": "%",
                 "watt": "W"}.get(unit, unit.removeprefix("suffix:").strip())


def _series(panel: dict[str, Any], start: float) -> list[tuple[str, list[float], list[float]]]:
    out = []
    for q in panel["queries"]:
        for s in q["result"]:
            points = [(float(t) - start, float(v)) for t, v in s["values"]
                      if not math.isnan(float(v))]
            if points:
                xs, ys = zip(*points, strict=True)
                out.append((legend(q["legend"], s["metric"]), list(xs), list(ys)))
    return out


def draw_timeseries(ax: Axes, panel: dict[str, Any], start: float) -> None:
    series = _series(panel, start)
    if not series:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes,
                color="#a00", fontsize=12)
        return
    peak = max(max(abs(y) for y in ys) for _, _, ys in series)
    factor, label = scale(panel["unit"], peak)
    for name, xs, ys in series:
        ax.plot(xs, [y * factor for y in ys], linewidth=1.4, label=name)
    ax.set_ylabel(label, fontsize=9)
    ax.set_xlabel("seconds into the load run", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    if peak == 0:
        ax.set_ylim(0, 1)  # all zero: a flat line at the bottom, not centred on +-0.05
    else:
        # From zero, with headroom: a flat line at the peak would sit on the top spine.
        low, high = ax.get_ylim()
        ax.set_ylim(min(0.0, low), max(high, peak * factor * 1.08))
    # Grafana draws a threshold only where it falls inside the axis the data sets.
    bottom, top = ax.get_ylim()
    for value, color in zip(panel.get("thresholds", []), ("tab:orange", "tab:red"), strict=False):
        if bottom <= value * factor <= top:
            ax.axhline(value * factor, color=color, linestyle="--", linewidth=1)
    # Below the plot, as Grafana's bottom legend: on top it would hide the highest lines.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.2), frameon=False,
              ncol=2 if len(series) > 2 else 1, borderaxespad=0)


def draw_table(ax: Axes, panel: dict[str, Any]) -> None:
    ax.axis("off")
    rows = [s["metric"] for q in panel["queries"] for s in q["result"]]
    if not rows:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="#a00", fontsize=12)
        return
    columns = [k for k in sorted({k for r in rows for k in r})
               if k not in ("__name__", "job", "instance")]
    table = ax.table(cellText=[[r.get(c, "") for c in columns] for r in rows],
                     colLabels=columns, loc="center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.6)


def synthetic(panel: dict[str, Any], metrics: list[str]) -> bool:
    return any(m in q["expr"] for q in panel["queries"] for m in metrics)


def render(dashboard: dict[str, Any], start: float, path: Path,
           synthetic_metrics: list[str] | None = None) -> None:
    panels = dashboard["panels"]
    rows = math.ceil(len(panels) / COLUMNS)
    # Constrained layout leaves room for the legends below the plots.
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(6.4 * COLUMNS, ROW_HEIGHT * rows + 0.8),
                             squeeze=False, layout="constrained")
    variables = ", ".join(f"{k}={'All' if v == '.*' else v}"
                          for k, v in dashboard["variables"].items() if not k.startswith("__"))
    fig.suptitle(f"{dashboard['title']}    ({variables})", fontsize=14, x=0.01, ha="left")
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.axis("off")
            continue
        p = panels[i]
        title = p["title"]
        if synthetic(p, synthetic_metrics or []):
            title += "  [synthetic series]"
        ax.set_title(title, fontsize=11, loc="left", fontweight="bold")
        if p["kind"] == "timeseries":
            draw_timeseries(ax, p, start)
        else:
            draw_table(ax, p)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.dashboards.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="query results from the e2e test")
    p.add_argument("--out", type=Path, default=Path("docs"),
                   help="directory for the PNGs (default: docs)")
    args = p.parse_args(argv)
    try:
        data = json.loads(args.results.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        cli_error.fail(p.prog, f"cannot read {args.results}: {exc}")
    if not (isinstance(data, dict) and isinstance(data.get("dashboards"), dict)
            and isinstance(data.get("start"), (int, float))):
        cli_error.fail(p.prog, f"{args.results} is not a results file (a JSON object with "
                       "'dashboards' and 'start', as tests/e2e/test_observability.py writes it)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, dashboard in data["dashboards"].items():
        path = args.out / f"dashboard-{name.removesuffix('.json').removeprefix('llmserve-')}.png"
        render(dashboard, data["start"], path, data.get("synthetic"))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
