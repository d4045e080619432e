"""Profiling: measure per-K step latency inside one engine and fit the latency model.

``samples``   read and validate the controller's samples file (one JSON line per verified step)
``fit``       the step-latency model, fitted by non-negative least squares (SciPy)
``workloads`` the prompts a collect run feeds the engine
``collect``   the driver: one engine, the sweep policy, phases per batch size, progress on stderr
``manifest``  what was measured: versions, hardware, settings, the exact command
``plot``      predicted vs measured latency (matplotlib)

The profile written is the ``vspec-profile/1`` document of vspec_runtime.control.latency_profile:
that module stays the one contract, this package only produces it.
"""

from __future__ import annotations

from pathlib import Path

SAMPLES_SUFFIX = ".samples.jsonl"
MANIFEST_SUFFIX = ".manifest.json"


def companion_paths(profile_path: Path) -> tuple[Path, Path]:
    """Where the samples and manifest of ``profile_path`` live: beside it, same stem."""
    stem = profile_path.name.removesuffix(".json")
    return profile_path.with_name(stem + SAMPLES_SUFFIX), profile_path.with_name(stem + MANIFEST_SUFFIX)


def manifest_for_samples(samples_path: Path) -> Path:
    """The manifest that a collect run wrote beside ``samples_path`` (it may not exist)."""
    stem = samples_path.name.removesuffix(SAMPLES_SUFFIX).removesuffix(".jsonl")
    return samples_path.with_name(stem + MANIFEST_SUFFIX)
