"""`vspec enable`, `vspec disable`, `vspec status`: whether plain `vllm serve` gets the plugin.

Disabled (the default) means a plain `vllm serve` behaves exactly as without vspec; `vspec serve`
always works. Running servers are never touched: they read the switch when they start.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from dataclasses import asdict, dataclass

import typer

from vspec_cli import _output, state
from vspec_cli._options import DryRunOpt, JsonOpt
from vspec_cli.installation import installed_here, restart_notice, running_vllm_servers, visible_copies
from vspec_runtime import __version__

PLUGIN_GROUP = "vllm.general_plugins"


@dataclass(frozen=True)
class SwitchResult:
    enabled: bool
    changed: bool
    dry_run: bool
    state_file: str
    warnings: list[str]
    restart: str


def switch(enabled: bool, dry_run: bool = False) -> SwitchResult:
    before = state.read_state()
    warnings = []
    if enabled and not any(ep.name == "vspec" for ep in metadata.entry_points(group=PLUGIN_GROUP)):
        warnings.append("the vspec plugin entry point is not installed in this environment, so plain "
                        "`vllm serve` cannot load it: run `vspec install` (or `pip install -e .`) first")
    if not dry_run:
        state.set_enabled(enabled)
    return SwitchResult(enabled, before.enabled != enabled, dry_run, str(state.state_path()), warnings,
                        restart_notice(running_vllm_servers()))


def status_data() -> dict:
    current = state.read_state()
    here = installed_here()
    others = [asdict(c) for c in visible_copies() if not c.here]
    return {
        "state_file": str(state.state_path()),
        "enabled": current.enabled,
        "installed_version": current.installed_version,
        "installed_source": current.installed_source,
        "previous_versions": list(current.previous_versions),
        "environment": {"python": sys.executable, "prefix": sys.prefix,
                        "vspec": asdict(here) if here else None, "other_copies": others},
        "running_cli_version": __version__,
        "running_vllm_servers": running_vllm_servers(),
        "last_operation": current.history[-1] if current.history else None,
    }


def _render_switch(result: SwitchResult, json_out: bool) -> None:
    if json_out:
        _output.print_json("switch", asdict(result))
        return
    word = "enabled" if result.enabled else "disabled"
    if result.dry_run:
        verb = f"would set enabled = {str(result.enabled).lower()}" if result.changed else f"already {word}; would change nothing"
        _output.stdout.print(f"{verb} in {result.state_file}", highlight=False)
    elif result.changed:
        _output.stdout.print(f"vspec {word} for plain `vllm serve` ({result.state_file})", highlight=False)
    else:
        _output.stdout.print(f"vspec was already {word} ({result.state_file})", highlight=False)
    for warning in result.warnings:
        _output.warn(warning)
    _output.hint(result.restart)


def enable(dry_run: DryRunOpt = False, json_out: JsonOpt = False) -> None:
    """Apply the vspec plugin to vLLM servers started with plain `vllm serve` (adaptive K by default).

    The state file's optional [runtime] table sets the controller for those servers.
    """
    _render_switch(switch(True, dry_run), json_out)


def disable(dry_run: DryRunOpt = False, json_out: JsonOpt = False) -> None:
    """Leave plain `vllm serve` untouched. `vspec serve` keeps working."""
    _render_switch(switch(False, dry_run), json_out)


def status(json_out: JsonOpt = False) -> None:
    """Whether vspec is enabled, which version is installed here, what rollback would return to."""
    data = status_data()
    if json_out:
        _output.print_json("status", data)
        return
    env = data["environment"]
    here = env["vspec"]
    rows = [
        ("enabled", "yes: plain `vllm serve` loads vspec" if data["enabled"] else "no: plain `vllm serve` is untouched"),
        ("installed here", f"{here['version']}{' (editable)' if here['editable'] else ''} in {here['location']}" if here else "no"),
        ("recorded version", data["installed_version"] or "-"),
        ("rollback to", data["previous_versions"][-1] if data["previous_versions"] else "-"),
        ("state file", data["state_file"]),
        ("python", env["python"]),
    ]
    if here and data["installed_version"] and here["version"] != data["installed_version"]:
        rows.append(("note", f"the state file records {data['installed_version']} but {here['version']} is installed "
                             "(changed outside vspec?)"))
    rows += [("also visible", f"{c['version']} in {c['location']}") for c in env["other_copies"]]
    rows += [("vLLM server", f"pid {s['pid']}: {s['command']}") for s in data["running_vllm_servers"]]
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in rows:
        table.add_row(f"[bold]{key}[/bold]", value)
    _output.stdout.print(table)


_EXAMPLES = {
    "enable": "vspec enable\n  vspec enable --dry-run",
    "disable": "vspec disable\n  vspec disable --json",
    "status": "vspec status\n  vspec status --json | jq .enabled",
}


def register(app: typer.Typer) -> None:
    for func in (enable, disable, status):
        examples = f"\n\n[bold]Examples[/bold]\n\n  {_EXAMPLES[func.__name__]}\n"
        app.command(func.__name__, help=func.__doc__.rstrip() + examples)(func)
