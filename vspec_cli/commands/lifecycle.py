"""`vspec install`, `upgrade`, `rollback`, `uninstall`: the command line over vspec_cli/lifecycle.py.

Each command plans its change (lifecycle.plan_*), executes it (lifecycle.execute: pip, the check,
the state file, the restore on failure) and renders the outcome here.
"""

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from vspec_cli import _output
from vspec_cli._options import DryRunOpt, JsonOpt, YesOpt
from vspec_cli.lifecycle import Outcome, Plan, execute, plan_install, plan_rollback, plan_uninstall, plan_upgrade

NoDepsOpt = Annotated[bool, typer.Option("--no-deps", help="Install only vspec; its dependencies are already present.")]
NoCheckOpt = Annotated[bool, typer.Option("--no-check", help="Skip the `vspec doctor` run after the change.")]
WheelOpt = Annotated[Optional[Path], typer.Option("--wheel", help="A vspec wheel file.", show_default=False)]


def _run(plan_factory, dry_run: bool, yes: bool, json_out: bool) -> None:
    outcome = execute(plan_factory(), dry_run, yes)
    render(outcome, json_out)


def render(outcome: Outcome, json_out: bool) -> None:
    if json_out:
        _output.print_json("lifecycle", asdict(outcome))
        return
    would = "would " if outcome.dry_run else ""
    out = _output.stdout
    for command in outcome.pip_commands:
        out.print(f"{would}run: {' '.join(command)}", highlight=False)
    for change in outcome.state_changes:
        out.print(f"{would}set {change['key']}: {change['from']!r} -> {change['to']!r}  ({outcome.state_file})", highlight=False)
    if outcome.dry_run:
        for command in outcome.restore_commands:
            out.print(f"on failure would run: {' '.join(command)}", highlight=False)
    out.print(f"check: {outcome.check}", highlight=False)
    if not outcome.dry_run:
        done = {"uninstall": "uninstalled vspec " + str(outcome.from_version)}.get(
            outcome.action, f"vspec {outcome.to_version} installed ({outcome.action})")
        out.print(done, highlight=False)
    _output.hint(outcome.restart)


def install(
    editable: Annotated[Optional[Path], typer.Option("--editable", "-e", help="A vspec source tree (pip install -e).", show_default=False)] = None,
    wheel: WheelOpt = None,
    version: Annotated[Optional[str], typer.Option("--version", help="A released version from the package index.", show_default=False)] = None,
    extra: Annotated[Optional[str], typer.Option(help="Also install the platform stack: cpu, cuda or ascend.", show_default=False)] = None,
    enable: Annotated[bool, typer.Option("--enable", help="Then apply vspec to plain `vllm serve` (see `vspec enable`).")] = False,
    no_deps: NoDepsOpt = False,
    no_check: NoCheckOpt = False,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Install vspec into this interpreter's environment with pip, check it, record it in the state file."""
    _run(lambda: plan_install(editable, wheel, version, extra, enable, no_deps, not no_check), dry_run, yes, json_out)


def _reinstall_command(name: str, version_option: Any, plan: Callable[..., Plan], doc: str) -> Callable[..., None]:
    """`upgrade` and `rollback`: one version option of their own, then the same options in the same order.

    The version option is passed in as an ``Annotated`` alias; the annotations of ``command`` are
    evaluated here (this module does not postpone them), so Typer sees each command's own option.
    """

    def command(
        version: version_option = None,
        wheel: WheelOpt = None,
        no_deps: NoDepsOpt = False,
        no_check: NoCheckOpt = False,
        dry_run: DryRunOpt = False,
        yes: YesOpt = False,
        json_out: JsonOpt = False,
    ) -> None:
        _run(lambda: plan(version, wheel, no_deps, not no_check), dry_run, yes, json_out)

    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command


upgrade = _reinstall_command(
    "upgrade",
    Annotated[Optional[str], typer.Option("--version", help="Target version from the package index.", show_default=False)],
    plan_upgrade,
    "Move to a newer vspec (no pip cache), check it with `vspec doctor`; on failure the old one comes back.",
)
rollback = _reinstall_command(
    "rollback",
    Annotated[Optional[str], typer.Option("--to", help="A recorded (or released) version.", show_default=False)],
    plan_rollback,
    "Go back to the last recorded version (or --to V / --wheel FILE), reinstalled from where it came from.",
)


def uninstall(dry_run: DryRunOpt = False, yes: YesOpt = False, json_out: JsonOpt = False) -> None:
    """Disable vspec and remove its distribution from this environment; vLLM, torch and models stay.

    Refuses when another vspec would stay visible from a parent environment.
    """
    _run(plan_uninstall, dry_run, yes, json_out)


_EXAMPLES = {
    "install": ["vspec install --wheel dist/vspec-0.2.0-py3-none-any.whl --enable",
                "vspec install --version 0.2.0 --extra cuda",
                "vspec install --editable . --no-deps --dry-run"],
    "upgrade": ["vspec upgrade --version 0.3.0", "vspec upgrade --wheel dist/vspec-0.3.0-py3-none-any.whl --dry-run"],
    "rollback": ["vspec rollback", "vspec rollback --to 0.1.0 --yes", "vspec rollback --dry-run --json"],
    "uninstall": ["vspec uninstall --dry-run", "vspec uninstall --yes"],
}


def register(app: typer.Typer) -> None:
    for func in (install, upgrade, rollback, uninstall):
        examples = "\n\n[bold]Examples[/bold]\n\n" + "\n".join(f"  {e}" for e in _EXAMPLES[func.__name__]) + "\n"
        app.command(func.__name__, help=func.__doc__.rstrip() + examples)(func)
