"""Where a vspec version comes from, and the pip requirement that installs it again.

A source is stored in the state file as one string so rollback can reinstall exactly what was
there: "wheel:/abs/vspec-0.1.0-py3-none-any.whl", "editable:/abs/src", "index:0.2.0" or "index:"
(the latest). vspec_cli/lifecycle.py plans and runs the changes that use them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from vspec_cli import installation
from vspec_cli._errors import UserInputError

DIST = "vspec"


def wheel_source(path: Path) -> tuple[str, str]:
    path = path.expanduser()
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise UserInputError(f"{path.name} is not a wheel file name ({exc})") from None
    if name != DIST:
        raise UserInputError(f"{path.name} is a wheel of '{name}', not of vspec")
    if not path.is_file():
        raise UserInputError(f"wheel {path} does not exist", hint="build one with `python -m pip wheel --no-deps .`")
    return f"wheel:{path.resolve()}", str(version)


def index_source(version: Optional[str]) -> tuple[str, Optional[str]]:
    if version is None:
        return "index:", None
    try:
        return f"index:{Version(version)}", str(Version(version))
    except InvalidVersion:
        raise UserInputError(f"'{version}' is not a version number") from None


def editable_source(path: Path) -> tuple[str, Optional[str]]:
    path = path.expanduser().resolve()
    if not (path / "pyproject.toml").is_file():
        raise UserInputError(f"{path} is not a vspec source tree (no pyproject.toml)")
    init = path / "vspec_runtime" / "__init__.py"
    found = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', init.read_text(), re.M) if init.is_file() else None
    return f"editable:{path}", found.group(1) if found else None


def pip_requirement(source: str, extra: Optional[str] = None) -> list[str]:
    kind, _, value = source.partition(":")
    suffix = f"[{extra}]" if extra else ""
    if kind == "wheel":
        return [value + suffix]
    if kind == "editable":
        return ["-e", value + suffix]
    if kind == "index":
        return [f"{DIST}{suffix}" + (f"=={value}" if value else "")]
    raise UserInputError(f"unknown install source '{source}' in the state file")


def source_of_copy(copy: installation.InstalledCopy, recorded: dict[str, str]) -> str:
    """How to reinstall the copy that is there now: recorded source, editable tree, else the index."""
    known = recorded.get(copy.version)
    if known and not (known.startswith("wheel:") and not Path(known[len("wheel:"):]).is_file()):
        return known
    if copy.editable:
        tree = _editable_tree(copy)
        if tree:
            return f"editable:{tree}"
    return f"index:{copy.version}"


def _editable_tree(copy: installation.InstalledCopy) -> Optional[str]:
    import importlib.metadata as metadata
    from urllib.parse import unquote, urlparse

    for dist in metadata.distributions(path=[copy.location]):
        if (dist.metadata["Name"] or "").lower() == DIST:
            text = dist.read_text("direct_url.json") or "{}"
            url = json.loads(text).get("url", "")
            if url.startswith("file://"):
                return unquote(urlparse(url).path)
    return None
