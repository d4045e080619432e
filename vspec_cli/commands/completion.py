"""Shell completion scripts for bash, zsh and fish, generated into completions/.

They are exactly what `vspec --show-completion SHELL` prints (Typer's scripts for prog name
`vspec`, complete variable `_VSPEC_COMPLETE`): each asks `vspec` itself for the candidates, so new
commands, options and model names complete without regenerating. They change only when Typer's
templates do; tests/test_completions.py regenerates them and fails on any difference.

Regenerate with `vspec completions generate` (or `python -m vspec_cli completions generate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vspec_cli._factory import typer_factory

PROG_NAME = "vspec"
COMPLETE_VAR = "_VSPEC_COMPLETE"
SCRIPTS = {"bash": "vspec.bash", "zsh": "vspec.zsh", "fish": "vspec.fish"}
REPO_COMPLETIONS = Path(__file__).resolve().parents[2] / "completions"


def script(shell: str) -> str:
    # typer.completion is Typer's public completion module; this is the function behind
    # `--show-completion`, so the files match what `--install-completion` writes.
    from typer.completion import get_completion_script

    return get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell) + "\n"


def generate(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for shell, name in SCRIPTS.items():
        target = folder / name
        target.write_text(script(shell), encoding="utf-8")
        written.append(target)
    return written


def stale(folder: Path) -> list[str]:
    """Names of scripts in ``folder`` that are missing or differ from what would be generated."""
    return [name for shell, name in SCRIPTS.items()
            if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != script(shell)]


app = typer_factory(help="Shell completion scripts (bash, zsh, fish). For one shell: `vspec --install-completion`.")


@app.callback()
def _completions() -> None:
    """Shell completion scripts (bash, zsh, fish)."""


@app.command("generate", epilog="""[bold]Examples[/bold]

  vspec completions generate                    # rewrite completions/ in a source checkout
  vspec completions generate --dir /tmp/c       # somewhere else
  vspec completions generate --check            # exit 1 if completions/ is stale (CI)
""")
def generate_command(
    folder: Annotated[Optional[Path], typer.Option("--dir", help="Target folder (default: completions/ of the source checkout).",
                                                   show_default=False)] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when a script is missing or stale.")] = False,
) -> None:
    """Write vspec.bash, vspec.zsh and vspec.fish."""
    from vspec_cli import _output
    from vspec_cli._errors import UserInputError

    target = folder or REPO_COMPLETIONS
    if folder is None and not (REPO_COMPLETIONS.parent / "pyproject.toml").is_file():
        raise UserInputError("not running from a source checkout: give --dir", hint="vspec completions generate --dir DIR")
    if check:
        outdated = stale(target)
        for name in outdated:
            _output.stdout.print(f"stale: {target / name}", highlight=False)
        if outdated:
            raise typer.Exit(1)
        _output.stdout.print(f"up to date: {target}", highlight=False)
        return
    for path in generate(target):
        _output.stdout.print(f"wrote {path}", highlight=False)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="completions")
