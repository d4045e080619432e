"""Rich rendering of a profile and its fit (stdout: data; the CLI decides when)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from rich.table import Table

from vspec_cli import _output
from vspec_cli.profiling.fit import PointSummary
from vspec_runtime.control.latency_profile import ComponentLatency, LatencyProfile

MIN_ROW_SAMPLES = 3


def _component(name: str, component: Optional[ComponentLatency], variable: str) -> str:
    if component is None:
        return f"{name}: none (no drafter model; drafting cost is in the per-K overhead)"
    return (f"{name}: {component.alpha:.3g} ms x ctx + {component.c:.4g} ms x {variable} "
            f"+ {component.delta:.4g} ms")


def model_lines(profile: LatencyProfile) -> list[str]:
    lines = [
        "T_step(B, K, ctx) = target(ctx, B*(K+1)) + K x drafter(ctx, B) + overhead(K)   [ms; ctx = context summed over the batch]",
        "  " + _component("target ", profile.target, "n"),
        "  " + _component("drafter", profile.drafter, "B"),
    ]
    if profile.overhead_ms_per_k:
        overheads = ", ".join(f"K={k}: {v:.3g}" for k, v in sorted(profile.overhead_ms_per_k.items()))
        lines.append(f"  overhead(K) ms: {overheads}")
    lines.append(f"  max K: {profile.max_gamma}")
    if profile.table:
        lines.append("  batch-size -> K prior: " + ", ".join(f"{b} -> {k}" for b, k in sorted(profile.table.items())))
    return lines


def points_table(points: Sequence[PointSummary], title: str) -> tuple[Table, int]:
    """The table of (batch, K) points with enough samples; also how many points were left out."""
    table = Table("batch", "K", "samples", "measured ms", "predicted ms", "error", "tok/s", title=title,
                  title_justify="left")
    hidden = 0
    for point in points:
        if point.samples < MIN_ROW_SAMPLES:
            hidden += 1
            continue
        table.add_row(str(point.batch_size), str(point.gamma), str(point.samples), f"{point.measured_ms:.1f}",
                      f"{point.predicted_ms:.1f}", f"{100 * point.error:.1f}%", f"{point.tokens_per_s:.1f}")
    return table, hidden


def render_profile(profile: LatencyProfile, points: Sequence[PointSummary], fit: Optional[dict[str, Any]],
                   heldout_error: Optional[float], source: str) -> None:
    out = _output.stdout
    out.print(f"[bold]Profile[/bold] {source}", highlight=False)
    for line in model_lines(profile):
        out.print(line, highlight=False)
    meta = profile.meta
    described = [f"{k}={meta[k]}" for k in ("target_model", "method", "device", "dtype", "workload") if meta.get(k)]
    if described:
        out.print("  measured with: " + ", ".join(described), highlight=False)
    if points:
        table, hidden = points_table(points, "predicted vs measured step latency (medians)")
        out.print(table)
        if hidden:
            _output.hint(f"{hidden} (batch, K) points with fewer than {MIN_ROW_SAMPLES} samples not shown "
                         "(a batch draining at the end of a phase)")
    if heldout_error is not None:
        detail = ""
        if fit:
            samples = fit.get("samples", {})
            detail = (f" on {samples.get('heldout')} held-out samples ({fit.get('holdout')}); "
                      f"{samples.get('trimmed', 0)} of {samples.get('train')} training samples trimmed as outliers")
        out.print(f"held-out median absolute error: [bold]{100 * heldout_error:.1f}%[/bold]{detail}", highlight=False)


def render_fit(result: Any, profile_path: Path) -> None:
    """A FitResult of profiling/fit_file.py as `vspec fit` and `vspec profile collect` show it."""
    render_profile(result.profile, result.points, result.summary(), result.heldout_error, str(profile_path))
    _output.hint(f"wrote {profile_path}")
