"""`vspec fit SAMPLES -o PROFILE`: fit the step-latency model to a samples file (see profiling/fit.py)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli._options import JsonOpt

EXAMPLES = """
[bold]Examples[/bold]

  vspec fit profiles/demo-cpu.samples.jsonl -o profiles/demo-cpu.json
  vspec fit run.samples.jsonl -o gamma4.json --max-gamma 4    # for a server started with --gamma 4
  vspec fit run.samples.jsonl -o p.json --method draft --json
"""

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
    from vspec_cli.profiling import manifest_for_samples
    from vspec_cli.profiling.files import write_json
    from vspec_cli.profiling.fit import fit_samples, profile_document
    from vspec_cli.profiling.manifest import profile_meta
    from vspec_cli.profiling.samples import read_samples
    from vspec_runtime.spec import METHODS_WITH_DRAFTER

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


def render_fit(result: Any, profile_path: Path) -> None:
    from vspec_cli.profiling.render import render_profile

    render_profile(result.profile, result.points, result.summary(), result.heldout_error, str(profile_path))
    _output.hint(f"wrote {profile_path}")


def fit(
    samples: Annotated[Path, typer.Argument(help="Samples file (JSON lines) from `vspec profile collect`.",
                                            show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write.", show_default=False)],
    method: Annotated[Optional[str], typer.Option(
        help="Drafting method of the samples (default: from the manifest beside them, else ngram).",
        show_default=False)] = None,
    max_gamma: Annotated[Optional[int], typer.Option(
        help="Fit only K <= this (the maximum K of the server that will use the profile).", show_default=False)] = None,
    holdout_every: Annotated[int, typer.Option(help="Hold out every N-th stable sample to measure the error (0: none).")] = 5,
    table: Annotated[bool, typer.Option("--table/--no-table",
                                        help="Add the measured batch-size -> K prior to the profile.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Fit the step-latency model by non-negative least squares and report the held-out error.

    Model: T_step = target(ctx, n) + K x drafter(ctx, B) + overhead(K), each forward
    alpha x ctx + c x tokens + delta, fitted jointly on all stable steps (scipy.optimize.nnls).
    """
    if holdout_every < 0:
        raise UserInputError(f"--holdout-every: got {holdout_every}; must be >= 0")
    result, document = fit_file(samples, output, method=method, max_gamma=max_gamma,
                                holdout_every=holdout_every, with_table=table)
    if json_out:
        _output.print_json("fit", {"profile_path": str(output), "profile": document, "fit": result.summary()})
        return
    render_fit(result, output)


def register(app: typer.Typer) -> None:
    app.command("fit", help=inspect.cleandoc(fit.__doc__) + "\n" + EXAMPLES)(fit)
