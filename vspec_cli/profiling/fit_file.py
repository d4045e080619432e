"""A samples file in, a profile file out: reads the manifest beside the samples, fits, writes.

The maths is profiling/fit.py; this is the file side that `vspec fit` and `vspec profile collect`
(which fits right after it measured) share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli.profiling import manifest_for_samples
from vspec_cli.profiling.files import write_json
from vspec_cli.profiling.fit import fit_samples, profile_document
from vspec_cli.profiling.manifest import profile_meta
from vspec_cli.profiling.samples import read_samples
from vspec_runtime.spec import METHODS_WITH_DRAFTER

METHODS = ("ngram", "draft", "eagle", "eagle3")


def fit_file(
    samples_path: Path,
    profile_path: Path,
    *,
    method: Optional[str] = None,
    max_gamma: Optional[int] = None,
    holdout_every: int = 5,
    with_table: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Read, fit, write. Returns (FitResult, the document written)."""
    if not profile_path.name.endswith(".json"):
        raise UserInputError(f"--output: got '{profile_path}'; the profile is a .json file")
    manifest_path = manifest_for_samples(samples_path)
    manifest = _read_manifest(manifest_path)
    spec = manifest.get("spec") if manifest else None
    if method is None:
        method = (spec or {}).get("method") or "ngram"
        if not spec:
            _output.hint(f"no manifest at {manifest_path}: fitting as method '{method}' (no drafter model); "
                         "pass --method for draft/eagle samples")
    if method not in METHODS:
        raise UserInputError(f"--method: got '{method}'; choose one of {', '.join(METHODS)}")
    samples = read_samples(samples_path)
    meta = profile_meta(spec=spec, settings=(manifest or {}).get("settings"), samples_path=samples_path,
                        manifest_path=manifest_path if manifest else None, profile_path=profile_path)
    requested = ((manifest or {}).get("settings") or {}).get("batches")
    result = fit_samples(samples, model_drafter=method in METHODS_WITH_DRAFTER, max_gamma=max_gamma,
                         holdout_every=holdout_every, with_table=with_table, table_batches=requested, meta=meta,
                         source=str(samples_path))
    document = profile_document(result)
    write_json(profile_path, document)
    return result, document


def _read_manifest(path: Path) -> Optional[dict[str, Any]]:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: the manifest beside the samples is not valid JSON ({exc.msg})") from None
    return data if isinstance(data, dict) else None
