"""Reading and writing profile documents with one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from vspec_cli._errors import UserInputError
from vspec_cli.atomic import write_text_atomic
from vspec_runtime.control.latency_profile import LatencyProfile


def load_profile_file(path: Path, serving_max_gamma: Optional[int] = None) -> tuple[LatencyProfile, dict[str, Any]]:
    """The validated profile and its raw document. ``serving_max_gamma``: the server's maximum K.

    Meant for every CLI path that takes --adaptive-profile, so a bad profile stops the command with
    one line instead of failing inside the engine after it loaded the model.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"profile {path} does not exist",
                             hint="create one with `vspec profile collect` or `vspec fit SAMPLES -o PROFILE`") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserInputError(f"profile {path} is not readable as text ({type(exc).__name__})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    try:
        return LatencyProfile.from_dict(document, serving_max_gamma=serving_max_gamma), document
    except ValueError as exc:
        raise UserInputError(f"{path}: {exc}") from None


def write_json(path: Path, document: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(document, indent=2) + "\n")
    # The atomic write's temp file is private (0600); a profile is meant to be read by others.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
