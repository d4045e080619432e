"""PNG plots: throughput by policy per cell, and K over time for the adaptive runs.

matplotlib comes with the `bench` extra; without it the bench still runs and says plots were skipped.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vspec_cli.benchlib.runner import EngineRun


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    return plt


def throughput(cells: list[dict[str, Any]], path: Path, title: str) -> Path:
    plt = _pyplot()
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


def k_over_time(runs: list[EngineRun], path: Path, title: str) -> Path | None:
    """K the controller chose against seconds since the first phase, phases shaded by cell."""
    traced = [r for r in runs if r.ok and r.trace and r.phases]
    policies = list(dict.fromkeys(r.policy for r in traced))
    if not policies:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 2.8 * len(policies)), squeeze=False)
    for ax, policy in zip(axes.flat, policies):
        mine = sorted((r for r in traced if r.policy == policy), key=lambda r: r.repeat)
        _shade_cells(ax, mine[0])
        for run in mine:
            origin = run.phases[0]["started_at"]
            times = [line["time"] - origin for line in run.trace]
            gammas = [line["gamma"] for line in run.trace]
            end = run.phases[-1]["ended_at"] - origin
            keep = [(t, g) for t, g in zip(times, gammas) if t >= 0]
            before = [g for t, g in zip(times, gammas) if t < 0]
            if before:  # K in force when the first phase began
                keep.insert(0, (0.0, before[-1]))
            if not keep:
                continue
            xs, ys = zip(*keep)
            ax.step(list(xs) + [end], list(ys) + [ys[-1]], where="post", linewidth=1,
                    label=f"repeat {run.repeat + 1}")
        ax.set_ylabel("K")
        ax.set_title(policy, fontsize=10)
        ax.set_ylim(-0.3, max(line["gamma"] for run in mine for line in run.trace) + 1.2)
        ax.legend(fontsize=7, loc="lower right")
    axes.flat[-1].set_xlabel("seconds since the first phase (cells shaded as in the first repeat)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _shade_cells(ax, run: EngineRun) -> None:
    origin = run.phases[0]["started_at"]
    spans: dict[str, list[float]] = {}
    for phase in run.phases:
        span = spans.setdefault(phase["cell"], [phase["started_at"] - origin, 0.0])
        span[1] = phase["ended_at"] - origin
    for index, (cell, (start, end)) in enumerate(spans.items()):
        if index % 2:
            ax.axvspan(start, end, color="0.92", linewidth=0)
        ax.text((start + end) / 2, 0.97, cell, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=7, color="0.35")
