"""Run the `vspec` CLI in-process the way the console script does (errors rendered by main())."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> CliResult:
    from vspec_cli.app import main

    capsys.readouterr()  # drop anything printed before
    old_argv = sys.argv
    sys.argv = ["vspec", *args]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)
