"""The root of the `vspec` command: it only wires the modules of vspec_cli/commands/ and renders errors."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from vspec_cli._errors import VspecError
from vspec_cli._factory import typer_factory
from vspec_cli.commands import bench, completion, doctor, fit, lifecycle, models, profile, serve, switches
from vspec_cli.process import unwind_on_sigterm
from vspec_runtime import __version__, envs

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


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for --json; what follows `--` belongs to vLLM, not to vspec."""
    ours = args[:args.index("--")] if "--" in args else args
    return "--json" in ours


def _print_error_json(code: str, message: str, hint: Optional[str], exit_code: int) -> None:
    """A script reading stdout under --json gets one parseable object on failure too."""
    from vspec_cli import _output

    _output.print_json("error", {"error": {"code": code, "message": message, "hint": hint, "exit_code": exit_code}})


def _usage_error_class() -> type:
    # Typer re-exports BadParameter but not its base UsageError, whose module moved when Typer
    # started vendoring Click; the MRO finds it either way.
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _print_usage_error_json(exiting: SystemExit) -> None:
    """Typer prints a usage error itself and exits while handling it, so the error is the exit's context."""
    error = exiting.__context__
    if not isinstance(error, _usage_error_class()):
        return  # --help, typer.Exit(n) after a command's own JSON, ...: nothing to add
    ctx = getattr(error, "ctx", None)
    hint = f"{ctx.command_path} {ctx.help_option_names[0]}" if ctx is not None else None
    _print_error_json("usage", error.format_message(), hint, error.exit_code)


def main() -> None:
    """Console-script entry point: typed errors become one message and an exit code.

    Under --json a typed error, a usage error or a crash also prints one vspec/error/1 object on
    stdout; the human message (or traceback) stays on stderr and the exit code is unchanged.
    """
    unwind_on_sigterm()  # engines and servers in groups of their own must stop with us
    debug = bool(envs.get("VSPEC_DEBUG", False))
    as_json = _wants_json(sys.argv[1:])
    try:
        app(standalone_mode=True)
    except VspecError as error:
        if as_json:  # with VSPEC_DEBUG the traceback ends the process, with status 1
            _print_error_json(error.code, error.message, error.hint, 1 if debug else error.exit_code)
        if debug:
            raise
        sys.exit(_render_error(error))
    except SystemExit as exiting:
        if as_json:
            _print_usage_error_json(exiting)
        raise
    except Exception as error:  # a bug: Python still prints the traceback and exits 1
        if as_json:
            _print_error_json("internal", f"{type(error).__name__}: {error}", None, 1)
        raise
