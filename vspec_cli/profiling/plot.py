"""Predicted vs measured step latency as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

from vspec_cli._errors import PreconditionError
from vspec_cli.profiling.fit import PointSummary, predict_sample
from vspec_cli.profiling.samples import Sample, usable
from vspec_runtime.control.latency_profile import LatencyProfile

MAX_BATCH_PANELS = 4
MIN_POINT_SAMPLES = 3


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PreconditionError("--plot needs matplotlib", hint="pip install 'vspec[bench]'") from None
    return plt


def main_batches(points: Sequence[PointSummary], preferred: Optional[Sequence[int]] = None) -> list[int]:
    """The batch sizes a collect run asked for (``preferred``) when present, else those measured at
    two or more K with a few samples each (not a draining tail), most samples first."""
    by_batch: dict[int, list[PointSummary]] = defaultdict(list)
    for point in points:
        if point.samples >= MIN_POINT_SAMPLES:
            by_batch[point.batch_size].append(point)
    chosen = [b for b in (preferred or ()) if len(by_batch.get(b, ())) >= 2]
    if chosen:
        return sorted(chosen)[:MAX_BATCH_PANELS]
    ranked = sorted((b for b, ps in by_batch.items() if len(ps) >= 2),
                    key=lambda b: -sum(p.samples for p in by_batch[b]))
    return sorted(ranked[:MAX_BATCH_PANELS])


def plot_profile(profile: LatencyProfile, points: Sequence[PointSummary], samples: Optional[Sequence[Sample]],
                 path: Path, title: str = "") -> Path:
    plt = _pyplot()
    requested = profile.meta.get("batches")
    batches = main_batches(points, requested if isinstance(requested, list) else None)
    panels = 1 + len(batches)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 4.0), squeeze=False)
    axes = axes[0]
    gammas = sorted({p.gamma for p in points})
    cmap = plt.get_cmap("viridis")

    def colour(gamma: int):
        return cmap(gammas.index(gamma) / max(1, len(gammas) - 1)) if gamma in gammas else "grey"

    scatter = axes[0]
    if samples:
        used = [s for s in usable(list(samples)) if s.gamma <= profile.max_gamma]
        for gamma in gammas:
            group = [s for s in used if s.gamma == gamma]
            scatter.scatter([s.interval_ms for s in group], [predict_sample(profile, s) for s in group],
                            s=8, alpha=0.5, color=colour(gamma), label=f"K={gamma}")
        values = [s.interval_ms for s in used]
    else:
        for point in points:
            scatter.scatter([point.measured_ms], [point.predicted_ms], s=20, color=colour(point.gamma))
        values = [p.measured_ms for p in points]
    if values:
        low, high = min(values) * 0.9, max(values) * 1.1
        scatter.plot([low, high], [low, high], color="black", linewidth=1)
        scatter.fill_between([low, high], [low * 0.85, high * 0.85], [low * 1.15, high * 1.15], color="grey",
                             alpha=0.15, label="±15%")
    scatter.set_xlabel("measured step latency (ms)")
    scatter.set_ylabel("predicted (ms)")
    scatter.set_title("every stable step" if samples else "medians per (batch, K)")
    scatter.legend(fontsize=7, loc="upper left")

    for axis, batch in zip(axes[1:], batches):
        own = sorted((p for p in points if p.batch_size == batch), key=lambda p: p.gamma)
        ks = [p.gamma for p in own]
        axis.plot(ks, [p.measured_ms for p in own], "o", color="tab:blue", label="measured (median)")
        if samples:
            spread = _quartiles(samples, batch, profile.max_gamma)
            lows = [p.measured_ms - spread[p.gamma][0] for p in own]
            highs = [spread[p.gamma][1] - p.measured_ms for p in own]
            axis.errorbar(ks, [p.measured_ms for p in own], yerr=[lows, highs], fmt="none", color="tab:blue",
                          alpha=0.6)
        axis.plot(ks, [p.predicted_ms for p in own], "-", color="tab:orange", label="predicted (median)")
        axis.set_xlabel("K")
        axis.set_ylabel("step latency (ms)")
        axis.set_title(f"batch {batch}")
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _quartiles(samples: Sequence[Sample], batch: int, max_gamma: int) -> dict[int, tuple[float, float]]:
    groups: dict[int, list[float]] = defaultdict(list)
    for sample in usable(list(samples)):
        if sample.batch_size == batch and sample.gamma <= max_gamma:
            groups[sample.gamma].append(sample.interval_ms)
    result = {}
    for gamma, values in groups.items():
        if len(values) >= 2:
            q = statistics.quantiles(values, n=4)
            result[gamma] = (q[0], q[2])
        else:
            result[gamma] = (values[0], values[0])
    return result
