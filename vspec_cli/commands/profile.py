"""`vspec profile collect` and `vspec profile show`: measure per-K step latency, look at the fit."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli._factory import typer_factory
from vspec_cli._options import ConfigOpt, DryRunOpt, JsonOpt
from vspec_cli.spec_flags import ENGINE_FIELDS, MODEL_FIELDS, SpecOverrides, spec_flags

COLLECT_EXAMPLES = """
[bold]Examples[/bold]

  vspec profile collect --preset demo --gammas 0-6 --batches 1,8 -o profiles/demo-cpu.json
  vspec profile collect --preset demo --gammas 0,2,4,6 --batches 1,4,16 --max-num-seqs 16 -o p.json
  vspec profile collect --preset eagle --workload mixed --steps-per-point 40 -o eagle.json
  vspec profile collect --preset demo -o p.json --dry-run        # the phases and settings, no engine
"""

SHOW_EXAMPLES = """
[bold]Examples[/bold]

  vspec profile show profiles/demo-cpu.json
  vspec profile show profiles/demo-cpu.json --plot demo-cpu.png
  vspec profile show p.json --gamma 4          # also check it against a server with K <= 4
  vspec profile show p.json --json
"""

profile_app = typer_factory(help="Measure per-K step latency inside one engine, and show fitted profiles.")


@spec_flags(MODEL_FIELDS + ENGINE_FIELDS)
def collect(
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write; the samples, manifest "
                                         "and engine log go beside it (NAME.samples.jsonl, NAME.manifest.json, "
                                         "NAME.collect.log).", show_default=False)],
    preset: Annotated[Optional[str], typer.Option("--preset", "-p", help="Preset name or .toml file (as `vspec serve`).",
                                                  show_default=False)] = None,
    config: ConfigOpt = None,
    gammas: Annotated[Optional[str], typer.Option(help="K values to measure: '0,1,2' or '0-6' (default: 0 to gamma).",
                                                  show_default=False)] = None,
    batches: Annotated[str, typer.Option(help="Batch sizes, one phase each: '1,8' or '1,4,16'.")] = "1,8",
    workload: Annotated[str, typer.Option(help="Prompts, as `vspec bench`: copy (n-gram drafts match), chat, code, "
                                          "mixed or FILE.jsonl.")] = "copy",
    steps_per_k: Annotated[int, typer.Option(help="Decode steps per K before the sweep moves on.")] = 8,
    steps_per_point: Annotated[int, typer.Option(help="Stable steps wanted per (batch, K); sets phase length.")] = 20,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="Skip torch.compile / graphs: faster start, "
                                                "but not what a default server runs.")] = False,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
    *,
    spec_overrides: SpecOverrides,
) -> None:
    """Measure step latency for every K at every batch size in ONE engine, then fit the profile.

    The controller's sweep mode forces K through --gammas, --steps-per-k steps each, while one phase
    per batch size runs B prompts at once. Every stable decode step becomes a sample (batch, K,
    context, batched tokens, latency, drafted, accepted). Writes the samples, a manifest (versions,
    hardware, settings, this command) and the fitted profile, and reports the held-out error.
    """
    from vspec_cli.profiling.collect import CollectSettings, parse_int_list, plan_collect
    from vspec_cli.resolve import resolve_model_paths, resolve_spec

    spec = resolve_spec(preset, str(config) if config else None, spec_overrides)
    settings = CollectSettings(
        gammas=parse_int_list(gammas, "--gammas") if gammas else tuple(range(spec.gamma + 1)),
        batches=parse_int_list(batches, "--batches"),
        workload=workload,
        steps_per_k=steps_per_k,
        steps_per_point=steps_per_point,
        engine_overrides={"enforce_eager": True} if enforce_eager else {},
    )
    from vspec_cli.demo_model import prepare_demo_with_progress

    model_paths = resolve_model_paths(spec, strict=not dry_run,
                                      prepare_demo=None if dry_run else prepare_demo_with_progress)
    for note in model_paths.notes:
        _output.warn(note)
    plan = plan_collect(spec, settings, output, model_paths.target, model_paths.drafter)
    for note in plan.notes:
        _output.warn(note)
    if dry_run:
        _render_plan(plan, json_out)
        return
    summary = _collect_and_fit(plan, render=not json_out)
    if json_out:
        _output.print_json("profile-collect", summary)


def _render_plan(plan, json_out: bool) -> None:
    described = plan.describe()
    files = described["files"]
    described["would"] = [f"start one engine ({plan.spec.method}, K in {list(plan.settings.gammas)})",
                          *(f"run phase {p['name']}: {p['batch_size']} prompts x {p['max_tokens']} tokens"
                            for p in described["phases"]),
                          *(f"write {path}" for path in files.values())]
    if json_out:
        _output.print_json("profile-collect-plan", described)
        return
    for line in described["would"]:
        _output.stdout.print(f"would {line}", highlight=False)


def _collect_and_fit(plan, render: bool) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from vspec_cli.profiling import manifest as manifest_mod
    from vspec_cli.profiling.collect import phase_record, run_collect
    from vspec_cli.profiling.files import write_json
    from vspec_cli.profiling.fit import HOLDOUT_EVERY
    from vspec_cli.profiling.fit_file import fit_file
    from vspec_cli.profiling.render import render_fit

    settings = plan.settings
    started = manifest_mod.now_iso()
    load_before = manifest_mod.load_average()
    total = len(settings.batches) * len(settings.gammas) * settings.steps_per_point
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("stable samples"), TimeElapsedColumn(), console=_output.stderr, transient=False) as bar:
        task = bar.add_task("starting the engine (loading the model)", total=total)

        def on_progress(progress) -> None:
            if progress.last_batch is None:
                return
            bar.update(task, completed=progress.covered(settings),
                       description=f"batch {progress.last_batch}, K={progress.last_gamma}, {progress.lines} steps")

        result = run_collect(plan, on_progress)
    load_after = manifest_mod.load_average()

    from vspec_cli.profiling.samples import read_samples, usable

    samples = read_samples(plan.samples_path)
    stable = usable(samples)
    per_point: dict[str, dict[str, int]] = {}
    for sample in stable:
        per_point.setdefault(str(sample.batch_size), {}).setdefault(str(sample.gamma), 0)
        per_point[str(sample.batch_size)][str(sample.gamma)] += 1
    spec_dict = json.loads(plan.spec.to_json())
    manifest = manifest_mod.build_manifest(
        command=manifest_mod.command_line(),
        settings={**settings.as_dict(), "holdout_every": HOLDOUT_EVERY},
        spec=spec_dict,
        models={"target": plan.target_path, "drafter": plan.drafter_path},
        phases=[phase_record(p, r) for p, r in zip(plan.phases, result["phases"])],
        files={"profile": plan.profile_path.name, "samples": plan.samples_path.name,
               "log": plan.log_path.name},
        started=started,
        load_before=load_before,
        load_after=load_after,
        engine={"elapsed_s": round(result["elapsed_s"], 1), "engine_starts": 1,
                "controller": (result.get("controller") or {}).get("selections"),
                "prompts_sha256": manifest_mod.prompts_digest(plan.phases)},
        samples={"lines": len(samples), "stable": len(stable), "stable_per_batch_and_k": per_point},
        fit=None,
    )
    write_json(plan.manifest_path, manifest)
    short = [f"{b}x{k}" for b in settings.batches for k in settings.gammas
             if per_point.get(str(b), {}).get(str(k), 0) < settings.steps_per_point]
    if short:
        _output.warn(f"fewer than {settings.steps_per_point} stable samples at (batch x K): {', '.join(short)}")
    try:
        fit_result, document = fit_file(plan.samples_path, plan.profile_path, method=plan.spec.method)
    except UserInputError as exc:
        raise UserInputError(
            f"collected {len(stable)} stable samples but could not fit them: {exc.message}",
            hint=f"samples kept in {plan.samples_path}; re-fit with `vspec fit {plan.samples_path} -o {plan.profile_path}`",
        ) from None
    manifest["fit"] = {key: fit_result.summary()[key] for key in ("samples", "holdout", "heldout_median_ape",
                                                                   "train_median_ape", "heldout_median_ape_by_k")}
    write_json(plan.manifest_path, manifest)
    if render:
        render_fit(fit_result, plan.profile_path)
    _output.hint(f"wrote {plan.samples_path} and {plan.manifest_path} (engine log: {plan.log_path})")
    return {"profile_path": str(plan.profile_path), "manifest_path": str(plan.manifest_path),
            "samples_path": str(plan.samples_path), "profile": document, "fit": fit_result.summary()}


def show(
    profile: Annotated[Path, typer.Argument(help="Profile JSON.", show_default=False)],
    samples: Annotated[Optional[Path], typer.Option(help="Samples to compare against (default: the file the "
                                                    "profile names, when present).", show_default=False)] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write predicted vs measured latency as a PNG.",
                                                 show_default=False)] = None,
    gamma: Annotated[Optional[int], typer.Option(help="Check the profile against a server with this maximum K.",
                                                 show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a profile's latency model and its predicted vs measured step latency per (batch, K).

    With the samples the profile was fitted on (found beside it, or --samples) every stable step is
    re-predicted; without them the medians stored in the profile are shown.
    """
    from vspec_cli.profiling.files import load_profile_file
    from vspec_cli.profiling.fit import PointSummary, evaluate
    from vspec_cli.profiling.render import render_profile
    from vspec_cli.profiling.samples import read_samples

    latency, document = load_profile_file(profile, serving_max_gamma=gamma)
    fit_meta = latency.meta.get("fit") if isinstance(latency.meta.get("fit"), dict) else None
    samples_path = samples
    if samples_path is None and isinstance(latency.meta.get("samples"), str):
        candidate = profile.resolve().parent / latency.meta["samples"]
        samples_path = candidate if candidate.exists() else None
    measured = read_samples(samples_path) if samples_path is not None else None
    if measured is not None:
        evaluation = evaluate(latency, measured)
        points = evaluation["points"]
        # The fit's own figure when the profile carries it (same split; the fit's options may differ).
        heldout = (fit_meta or {}).get("heldout_median_ape", evaluation["heldout_error"])
    else:
        points = [PointSummary(p["batch_size"], p["k"], p["samples"], p["measured_ms"], p["predicted_ms"],
                               p["median_ape"], p["tokens_per_s"]) for p in (fit_meta or {}).get("points", [])]
        heldout = (fit_meta or {}).get("heldout_median_ape")
    if plot is not None:
        from vspec_cli.profiling.plot import plot_profile

        described = [str(latency.meta[k]) for k in ("target_model", "method", "device") if latency.meta.get(k)]
        title = profile.name + (": " + ", ".join(described) if described else "")
        plot_profile(latency, points, measured, plot, title=title)
    if json_out:
        _output.print_json("profile", {
            "profile_path": str(profile),
            "profile": document,
            "samples_path": str(samples_path) if samples_path else None,
            "heldout_median_ape": heldout,
            "points": [vars(p) for p in points],
            "plot": str(plot) if plot else None,
        })
        return
    render_profile(latency, points, fit_meta, heldout, str(profile))
    if samples_path is None:
        _output.hint("no samples found: showing the medians stored in the profile")
    if plot is not None:
        _output.hint(f"wrote {plot}")


def register(app: typer.Typer) -> None:
    profile_app.command("collect", help=inspect.cleandoc(collect.__doc__) + "\n" + COLLECT_EXAMPLES)(collect)
    profile_app.command("show", help=inspect.cleandoc(show.__doc__) + "\n" + SHOW_EXAMPLES)(show)
    app.add_typer(profile_app, name="profile")
