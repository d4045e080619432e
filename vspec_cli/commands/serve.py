"""`vspec serve PRESET`: resolve preset < config < flags into a RuntimeSpec and launch `vllm serve`."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from vspec_cli import _output
from vspec_cli._options import ConfigOpt, DryRunOpt, JsonOpt
from vspec_cli.demo_model import prepare_demo_with_progress
from vspec_cli.launch import build_launch
from vspec_cli.parallel_layout import parse_layout, preflight
from vspec_cli.presets import preset_description, preset_names
from vspec_cli.process import run_foreground
from vspec_cli.resolve import resolve_model_paths, resolve_spec
from vspec_cli.spec_flags import ALL_FIELDS, SpecOverrides, set_fields_help, spec_flags

EXAMPLES = """
[bold]Examples[/bold]

  vspec serve demo                                  # SmolLM2 on CPU, n-gram, adaptive K
  vspec serve demo --dry-run                        # show the environment and the exact command
  vspec serve demo --no-speculation --port 8001     # target-only, to compare
  vspec serve eagle --adaptive-policy fixed --gamma 3 -- --enforce-eager
  vspec serve --target-model ./my-model --method ngram --gamma 4
  vspec serve demo --set adaptive.trace=t.jsonl     # a field with no flag (see below)
"""


@spec_flags(ALL_FIELDS)
def serve(
    ctx: typer.Context,
    preset: Annotated[Optional[str], typer.Argument(help="Preset name (see --list-presets) or a .toml file.",
                                                    show_default=False)] = None,
    config: ConfigOpt = None,
    no_speculation: Annotated[bool, typer.Option("--no-speculation", help="Serve target-only (no drafter, no controller).")] = False,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
    list_presets: Annotated[bool, typer.Option("--list-presets", help="List the presets and exit.")] = False,
    *,
    spec_overrides: SpecOverrides,
) -> None:
    """Launch a real `vllm serve` with speculative decoding configured from a preset.

    Everything after `--` goes to `vllm serve` untouched. Precedence: preset < --config < flags.
    """
    if list_presets:
        _print_presets(json_out)
        return
    preset, vllm_args = split_vllm_args(preset, tuple(ctx.args))
    spec = resolve_spec(preset, str(config) if config else None, spec_overrides, no_speculation)
    model_paths = resolve_model_paths(spec, strict=not dry_run,
                                      prepare_demo=None if dry_run else prepare_demo_with_progress)
    preflight(parse_layout(tuple(spec.serving.extra_args) + vllm_args), spec.method, model_paths.target,
              model_paths.drafter, spec.serving.device)
    plan = build_launch(spec, model_paths.target, model_paths.drafter, vllm_args)
    for note in (*model_paths.notes, *plan.notes):
        _output.warn(note)

    if dry_run:
        if json_out:
            _output.print_json("serve-plan", {"argv": plan.argv, "env": plan.env})
        else:
            _output.stdout.print("[bold]Environment[/bold]")
            _output.stdout.print_json(json.dumps(plan.env))
            _output.stdout.print("[bold]Command[/bold]")
            print(plan.shell_command())
        return

    mode = "target-only" if not spec.speculating else (
        f"{spec.method} K<={spec.gamma}, " + (f"adaptive ({spec.adaptive.policy})" if spec.adaptive_active else "fixed K"))
    if spec.relaxed.enabled:
        mode += ", RELAXED ACCEPTANCE (outputs differ from target-only)"
    _output.hint(f"vspec: serving {spec.target_model} on http://{spec.serving.host}:{spec.serving.port} ({mode})")
    raise typer.Exit(run_foreground(plan.argv, plan.env))


def split_vllm_args(preset: Optional[str], extra: tuple[str, ...]) -> tuple[Optional[str], tuple[str, ...]]:
    """Without a preset, the first word after `--` lands in the PRESET argument (`vspec serve
    --target-model m -- --enforce-eager`); an option is never a preset, so it goes back to vLLM's args."""
    if preset is not None and preset.startswith("-"):
        return None, (preset, *extra)
    return preset, extra


def _print_presets(json_out: bool) -> None:
    presets = [{"name": name, "description": preset_description(name)} for name in preset_names()]
    if json_out:
        _output.print_json("presets", {"presets": presets})
        return
    from rich.table import Table

    table = Table("preset", "description")
    for entry in presets:
        table.add_row(entry["name"], entry["description"])
    _output.stdout.print(table)


def register(app: typer.Typer) -> None:
    app.command(
        "serve",
        help=serve.__doc__ + EXAMPLES,
        epilog=set_fields_help(ALL_FIELDS),
        context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
    )(serve)

