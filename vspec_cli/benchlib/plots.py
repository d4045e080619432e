"""PNG plots: throughput by policy per cell, and K over time for the adaptive runs.

matplotlib comes with the `bench` extra; without it the bench still runs and says plots were skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def throughput(cells: list[dict[str, Any]], path: Path, title: str) -> Path:
    plt = pyplot()
    columns = min(3, len(cells))
    rows = math.ceil(len(cells) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.6 * rows), squeeze=False)
    for ax, cell in zip(axes.flat, cells):
        labels = list(cell["policies"])
        medians = [cell["policies"][p]["tok_s_median"] or 0.0 for p in labels]
        low = [m - (cell["policies"][p]["tok_s_min"] or m) for p, m in zip(labels, medians)]
        high = [(cell["policies"][p]["tok_s_max"] or m) - m for p, m in zip(labels, medians)]
        colours = ["tab:gray" if p == "target-only" else "tab:blue" if p.startswith("fixed:") else "tab:orange"
                   for p in labels]
        ax.bar(range(len(labels)), medians, yerr=[low, high], color=colours, capsize=3)
        target = cell["policies"].get("target-only", {}).get("tok_s_median")
        if target:
            ax.axhline(target, color="tab:gray", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(cell["cell"], fontsize=10)
        ax.set_ylabel("output tok/s (median, min-max)", fontsize=8)
    for ax in list(axes.flat)[len(cells):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def k_over_time(series: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """K the controller chose during each cell, one line per repeat.

    ``series``: {"policy", "repeat" (1-based), "phases" (as in results.json runs), "trace"}. The x axis
    gives every cell the same width and places a decision by its time within the cell, so repeats line
    up even when a shared machine stalled one of them.
    """
    series = [s for s in series if s.get("trace") and s.get("phases")]
    policies = list(dict.fromkeys(s["policy"] for s in series))
    if not policies:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 2.8 * len(policies)), squeeze=False)
    for ax, policy in zip(axes.flat, policies):
        mine = sorted((s for s in series if s["policy"] == policy), key=lambda s: s["repeat"])
        spans = _cell_spans(mine[0]["phases"])
        for index, cell in enumerate(spans):
            if index % 2:
                ax.axvspan(index, index + 1, color="0.92", linewidth=0)
            ax.text(index + 0.5, 0.97, cell, transform=ax.get_xaxis_transform(), ha="center", va="top",
                    fontsize=7, color="0.35")
        top = 0
        for run in mine:
            xs, ys = _normalised_steps(run["trace"], _cell_spans(run["phases"]))
            if xs:
                ax.step(xs, ys, where="post", linewidth=1, label=f"repeat {run['repeat']}")
                top = max(top, max(ys))
        ax.set_xlim(0, len(spans))
        ax.set_xticks([])
        ax.set_ylim(-0.3, top + 1.2)
        ax.set_ylabel("K")
        ax.set_title(policy, fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    axes.flat[-1].set_xlabel("cells in run order; within a cell, time from its first to its last token")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell_spans(phases: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    spans: dict[str, tuple[float, float]] = {}
    for phase in phases:
        start = spans.get(phase["cell"], (phase["started_at"], 0.0))[0]
        spans[phase["cell"]] = (start, phase["ended_at"])
    return spans


def _normalised_steps(trace: list[dict[str, Any]], spans: dict[str, tuple[float, float]]):
    """Trace lines -> (x, K) with x = cell index + fraction of that cell's time; the K in force at each cell start."""
    xs: list[float] = []
    ys: list[int] = []
    lines = sorted(trace, key=lambda line: line["time"])
    for index, (start, end) in enumerate(spans.values()):
        before = [line["gamma"] for line in lines if line["time"] <= start]
        if before:
            xs.append(float(index))
            ys.append(before[-1])
        for line in lines:
            if start < line["time"] <= end:
                xs.append(index + (line["time"] - start) / max(end - start, 1e-9))
                ys.append(line["gamma"])
        if ys:
            xs.append(index + 1.0)
            ys.append(ys[-1])
    return xs, ys
