"""`vspec enable`, `vspec disable`, `vspec status`: whether plain `vllm serve` gets the plugin.

Disabled (the default) means a plain `vllm serve` behaves exactly as without vspec; `vspec serve`
always works. Running servers are never touched: they read the switch when they start.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import typer

from vspec_cli import _output, state
from vspec_cli._options import DryRunOpt, JsonOpt
from vspec_runtime import __version__

PLUGIN_GROUP = "vllm.general_plugins"


# --- what is installed where ------------------------------------------------------------------


@dataclass(frozen=True)
class InstalledCopy:
    version: str
    location: str
    editable: bool
    here: bool  # inside this interpreter's environment (sys.prefix); pip may change it


def environment_dirs() -> list[Path]:
    """This interpreter's own site-packages folders: the only ones vspec's lifecycle may change."""
    found = []
    for key in ("purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key]).resolve()
        if folder not in found:
            found.append(folder)
    return found


def visible_copies() -> list[InstalledCopy]:
    """Every vspec distribution this interpreter can see, in sys.path order."""
    own = environment_dirs()
    copies = []
    seen = set()
    for entry in sys.path:
        if not entry:
            continue  # `python -c`'s working directory: vLLM servers started elsewhere do not see it
        folder = Path(entry).resolve()
        if folder in seen or not folder.is_dir():
            continue
        seen.add(folder)
        for dist in metadata.distributions(path=[str(folder)]):
            if (dist.metadata["Name"] or "").lower() != "vspec":
                continue
            copies.append(InstalledCopy(dist.version, str(folder), _is_editable(dist), folder in own))
    return copies


def installed_here() -> Optional[InstalledCopy]:
    return next((copy for copy in visible_copies() if copy.here), None)


def _is_editable(dist: metadata.Distribution) -> bool:
    import json

    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except ValueError:
        return False


def running_vllm_servers() -> list[dict]:
    """vLLM processes on this host (Linux /proc); listed so the user knows what needs a restart."""
    proc = Path("/proc")
    found = []
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [arg.decode(errors="replace") for arg in argv if arg]
        if not words:
            continue
        if _is_vllm_server(words):
            found.append({"pid": int(entry.name), "command": " ".join(words)[:160]})
    return found


def _is_vllm_server(words: list[str]) -> bool:
    """`vllm serve ...`, `python .../vllm serve ...` or `python -m vllm.entrypoints...`."""
    if Path(words[0]).name == "vllm":
        return words[1:2] == ["serve"]
    if len(words) > 2 and Path(words[1]).name == "vllm":
        return words[2] == "serve"
    return len(words) > 2 and words[1] == "-m" and words[2].startswith("vllm.entrypoints")


def restart_notice(servers: list[dict]) -> str:
    if not servers:
        return "no running vLLM server found; new servers pick this up when they start"
    pids = ", ".join(str(s["pid"]) for s in servers)
    return f"restart needed: running vLLM servers (pid {pids}) keep their old setup; vspec never stops them"


# --- enable / disable / status ----------------------------------------------------------------


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
