"""The root of the `vspec` command: it only wires one module per subcommand and renders errors."""

from __future__ import annotations

import os
import sys

import typer

from vspec_cli import serve
from vspec_cli import models
from vspec_cli import doctor
from vspec_cli import switches
from vspec_cli import lifecycle
from vspec_cli import completion
from vspec_cli import profile
from vspec_cli import fit
from vspec_cli import bench
from vspec_cli._errors import VspecError
from vspec_cli._factory import typer_factory
from vspec_runtime import __version__

app = typer_factory(
    help="Adaptive speculative decoding for vLLM: install, check, serve, profile and benchmark it.",
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"vspec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_version_callback, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """Adaptive speculative decoding for vLLM."""


serve.register(app)
models.register(app)
doctor.register(app)
switches.register(app)
lifecycle.register(app)
completion.register(app)
profile.register(app)
fit.register(app)
bench.register(app)


def _render_error(error: VspecError) -> int:
    from vspec_cli._output import stderr

    stderr.print(f"[bold red]Error:[/bold red] {error.message}", highlight=False)
    if error.hint:
        stderr.print(f"  next: {error.hint}", highlight=False)
    return error.exit_code


def main() -> None:
    """Console-script entry point: typed errors become one message and an exit code."""
    debug = os.environ.get("VSPEC_DEBUG", "").lower() in ("1", "true", "yes")
    try:
        app(standalone_mode=True)
    except VspecError as error:
        if debug:
            raise
        sys.exit(_render_error(error))
