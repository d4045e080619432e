"""Options shared by several commands, as ``Annotated`` aliases.

The options that set RuntimeSpec fields (`--gamma`, `--adaptive-min-gamma`, `--set`, ...) are not
declared here: vspec_cli/spec_flags.py derives them from the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional, TypeVar

import typer

from vspec_cli._errors import UserInputError

Number = TypeVar("Number", int, float)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would happen; change nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", envvar="VSPEC_CONFIG", help="TOML file over the preset (same schema).",
                 show_default=False),
]


def parse_number_list(text: str, option: str, convert: Callable[[str], Number], what: str) -> list[Number]:
    """A comma-separated list of numbers > 0 (``--batch 1,8``, ``--rates 0.5,2``), duplicates dropped
    in order; a clear error naming ``option`` otherwise."""
    kind = "whole numbers" if convert is int else "numbers"
    try:
        values = [convert(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserInputError(f"{option}: expected comma-separated {kind} ({what}), got '{text}'") from None
    if not values or min(values) <= 0:
        raise UserInputError(f"{option}: {what} must be > 0, got '{text}'")
    return list(dict.fromkeys(values))
