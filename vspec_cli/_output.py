"""Rendering: data on stdout, hints and progress on stderr; versioned JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

JSON_SCHEMA_VERSION = 1

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


def print_json(kind: str, payload: dict[str, Any]) -> None:
    """One JSON object on stdout with a stable envelope: {"schema": "vspec/<kind>/1", ...}."""
    document = {"schema": f"vspec/{kind}/{JSON_SCHEMA_VERSION}", **payload}
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def hint(message: str) -> None:
    stderr.print(message, style="dim", highlight=False)


def warn(message: str) -> None:
    stderr.print(f"[yellow]Warning:[/yellow] {message}", highlight=False)
