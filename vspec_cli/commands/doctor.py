"""`vspec doctor`: the command line and the table over vspec_cli/doctor_checks.py.

The checks (what is probed, and each one-line reason) live in doctor_checks; this module parses the
options, picks the scope (a method, adaptive K, or a preset's), prints the report and exits 1 on
any fail.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vspec_cli.doctor_checks import Report, parallel_scope, preset_scope, run_doctor
from vspec_runtime import vllm_surface

EXAMPLES = """
[bold]Examples[/bold]

  vspec doctor
  vspec doctor --method eagle --adaptive
  vspec doctor --preset demo
  vspec doctor --preset eagle --json -- --tensor-parallel-size 2   # the layout and what supports it
  vspec doctor --json | jq '.checks[] | select(.status != "ok")'
"""


def doctor(
    ctx: typer.Context,
    method: Annotated[Optional[str], typer.Option(help="Check only what this method needs: ngram, draft, eagle, eagle3, none.",
                                                  show_default=False)] = None,
    adaptive: Annotated[bool, typer.Option("--adaptive", help="Include the checks for adaptive K (with --method).")] = False,
    preset: Annotated[Optional[str], typer.Option(help="Check what this preset (name or .toml file) would run: its method, "
                                                       "adaptive K and every extension it enables.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")] = False,
) -> None:
    """Check this host: Python, vspec, vLLM, torch, the platform, every vLLM symbol vspec uses and the plugin load.

    Without --method/--adaptive/--preset every check runs. With --preset, or vLLM's parallel flags
    after `--` (as `vspec serve` takes them), also the parallel layout that would run and which
    features support it (docs/scaling.md). Exit 1 when any check fails.
    """
    from vspec_cli import _output
    from vspec_cli._errors import UserInputError

    if method is not None and method not in vllm_surface.METHODS:
        raise UserInputError(f"--method must be one of {', '.join(vllm_surface.METHODS)}, not '{method}'")
    extensions = None
    if preset is not None:
        if method is not None or adaptive:
            raise UserInputError("--preset already says the method and whether K is adaptive: drop --method/--adaptive")
        method, adaptive, extensions = preset_scope(preset)
    report = run_doctor(method, adaptive, extensions=extensions)
    if preset is not None or ctx.args:
        report.add_parallel(parallel_scope(preset, method, tuple(ctx.args)))
    if json_out:
        _output.print_json("doctor", report.as_dict())
    else:
        render(report)
    if report.failed:
        raise typer.Exit(1)


def render(report: Report) -> None:
    from rich.table import Table

    from vspec_cli import _output

    env = report.environment
    vllm = env.get("vllm", {})
    lines = [
        f"python {env['python']['version']}  vspec {env['vspec']['version']}  "
        f"vllm {vllm.get('version', 'not installed')}  torch {env.get('torch') or 'not installed'}  "
        f"platform {env.get('platform')}",
    ]
    extras = [f"{key} {env[key]}" for key in ("vllm-ascend", "torch-npu") if key in env]
    if "git_revision" in vllm:
        extras.append(f"vllm source {vllm['source_tree']} @ {vllm['git_revision'][:12]}{' dirty' if vllm['dirty'] else ''}")
    if extras:
        lines.append("  ".join(extras))
    for line in lines:
        _output.stdout.print(line, highlight=False)
    from rich import box

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("check", overflow="fold", ratio=1)
    table.add_column("status", no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1)
    colours = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in report.checks:
        colour = colours[check.status]
        table.add_row(check.name, f"[{colour}]{check.status}[/{colour}]", check.reason)
    _output.stdout.print(table)
    if report.parallel is not None:
        _render_parallel(report.parallel)
    counts = report.summary()
    _output.stdout.print(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail", highlight=False)


def _render_parallel(parallel: dict) -> None:
    from rich import box
    from rich.table import Table

    from vspec_cli import _output

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"features under {parallel['describe']}",
                  title_justify="left")
    table.add_column("feature", no_wrap=True)
    table.add_column("support", no_wrap=True)
    table.add_column("why", overflow="fold", ratio=1)
    for feature, support in parallel["features"].items():
        table.add_row(feature, support["status"], support["why"])
    _output.stdout.print(table)


def register(app: typer.Typer) -> None:
    app.command("doctor", help=doctor.__doc__.rstrip() + "\n" + EXAMPLES,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(doctor)
