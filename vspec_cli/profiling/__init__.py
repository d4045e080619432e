"""Profiling: measure per-K step latency inside one engine and fit the latency model.

``samples``   read and validate the controller's samples file (one JSON line per verified step)
``fit``       the step-latency model, fitted by non-negative least squares (SciPy)
``fit_file``  a samples file (and its manifest) in, a profile file out: `vspec fit`, and collect's last step
``collect``   the driver: one engine, the sweep policy, one phase per batch size
``manifest``  what was measured: versions, hardware, settings, the exact command
``files``     profile documents in and out, with one-line errors
``render``    the rich tables; ``plot`` predicted vs measured latency (matplotlib)

Prompts come from vspec_cli/workloads.py, shared with `vspec bench`, so a profile and a bench run
see the same text.

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
