"""The comparison's four PNGs (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the backend

COLORS = ("tab:blue", "tab:orange")
STYLES = ("-", "--", ":", "-.")


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ttft_cdf(path: Path, series: dict[tuple[str, float], list[float]], labels: list[str],
             mode: str) -> None:
    """One line per target and level: the share of requests with TTFT <= x."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    levels = sorted({lvl for _, lvl in series})
    for (label, level), ttfts in sorted(series.items()):
        if not ttfts:
            continue
        xs = sorted(t * 1e3 for t in ttfts)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", color=COLORS[labels.index(label) % 2],
                linestyle=STYLES[levels.index(level) % len(STYLES)],
                label=f"{label}, {mode}={level:g}")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF per target and level")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _lines(ax: Any, results: list[dict[str, Any]], labels: list[str], x: Any, y: Any,
           annotate: Any = None) -> None:
    """One line per target, both axes from 0 to 25% past the largest value: room for the level
    labels, and a single level (an A/A run) is a visible point, not one on the frame."""
    all_x: list[float] = []
    all_y: list[float] = []
    for i, label in enumerate(labels):
        rows = [r for r in results if r["label"] == label]
        xs, ys = [x(r) for r in rows], [y(r) for r in rows]
        all_x += xs
        all_y += ys
        ax.plot(xs, ys, marker="o", color=COLORS[i % 2], label=label)
        if annotate:
            for r, xv, yv in zip(rows, xs, ys, strict=True):
                ax.annotate(annotate(r), (xv, yv), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=COLORS[i % 2])
    ax.set_xlim(0, 1.25 * max(all_x, default=1.0) or 1.0)
    ax.set_ylim(0, 1.25 * max(all_y, default=1.0) or 1.0)


def throughput(path: Path, results: list[dict[str, Any]], labels: list[str], mode: str) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _lines(ax, results, labels, lambda r: r[mode], lambda r: r["output_tok_s"])
    ax.set_xlabel("concurrent users" if mode == "users" else "arrival rate (req/s)")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"Output tokens per second against {mode}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)


def latency_throughput(path: Path, results: list[dict[str, Any]], labels: list[str],
                       mode: str) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _lines(ax, results, labels, lambda r: r["output_tok_s"], lambda r: r["tpot_ms"]["p50"],
           annotate=lambda r: f"{mode}={r[mode]:g}")
    ax.set_xlabel("output tok/s")
    ax.set_ylabel("TPOT p50 (ms)")
    ax.set_title("Latency against throughput (one point per level)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)


def pareto(path: Path, results: list[dict[str, Any]], labels: list[str], gpus: dict[str, int],
           mode: str, unit: str) -> None:
    """Output tok/s per GPU against tok/s per user (1000 / TPOT p50): up and right is better."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    rows = [r for r in results if r["tpot_ms"]["p50"] > 0]
    _lines(ax, rows, labels, lambda r: 1e3 / r["tpot_ms"]["p50"],
           lambda r: r["output_tok_s"] / gpus[r["label"]],
           annotate=lambda r: f"{mode}={r[mode]:g}")
    ax.set_xlabel("tok/s per user (1000 / TPOT p50)")
    ax.set_ylabel(f"output tok/s per {unit}")
    ax.set_title(f"Per-{unit} Pareto view ({unit}s = TP x PP x replicas: "
                 + ", ".join(f"{k} {v}" for k, v in gpus.items()) + ")", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, path)
