"""Options shared by several commands, as ``Annotated`` aliases.

The options that set RuntimeSpec fields (`--gamma`, `--adaptive-min-gamma`, `--set`, ...) are not
declared here: vspec_cli/spec_flags.py derives them from the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would happen; change nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", envvar="VSPEC_CONFIG", help="TOML file over the preset (same schema).",
                 show_default=False),
]
