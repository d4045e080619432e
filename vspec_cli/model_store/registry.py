"""The registry file (schema ``vspec-models/1``, at paths.registry_file() unless given): reading it,
changing it under a file lock with an atomic write, register and unregister."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Callable, Optional

from filelock import FileLock

from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.atomic import write_text_atomic
from vspec_cli.model_store.catalog import ROLES, builtin_for
from vspec_cli.model_store.checks import check_model_dir, expectation_for, looks_like_path
from vspec_runtime import paths

REGISTRY_SCHEMA = "vspec-models/1"


def _lock_for(path: Path) -> FileLock:
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock", timeout=30)


def read_registry(path: Optional[Path] = None) -> dict[str, dict]:
    """Registered models by name. A corrupt file is an error that names it and is left untouched."""
    path = path or paths.registry_file()
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PreconditionError(
            f"model registry {path} is corrupt ({exc}); it was left as it is",
            hint=f"fix or move {path} away, then run `vspec models list`",
        ) from None
    if not isinstance(document, dict) or document.get("schema") != REGISTRY_SCHEMA:
        raise PreconditionError(
            f"model registry {path} has an unknown schema (expected {REGISTRY_SCHEMA}); it was left as it is",
            hint=f"move {path} away and register the models again",
        )
    models = document.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(e, dict) and "path" in e for e in models.values()):
        raise PreconditionError(
            f"model registry {path} has malformed entries; it was left as it is",
            hint=f"fix or move {path} away, then register the models again",
        )
    return dict(models)


def update_registry(change: Callable[[dict[str, dict]], None], path: Optional[Path] = None) -> dict[str, dict]:
    """Apply ``change(models_dict)`` under a lock and write the result atomically."""
    path = path or paths.registry_file()
    with _lock_for(path):
        models = read_registry(path)
        change(models)
        document = {"schema": REGISTRY_SCHEMA, "models": dict(sorted(models.items()))}
        write_text_atomic(path, json.dumps(document, indent=2) + "\n")
    return models


def register(name: str, target: Path, role: Optional[str] = None,
             architectures: tuple[str, ...] = (), registry: Optional[Path] = None) -> dict:
    """Validate ``target`` for ``name`` and record it. Refuses (with the reason) a bad directory."""
    if looks_like_path(name) or not name or any(ch in name for ch in " /\\"):
        raise UserInputError(f"'{name}' is not a usable model name (no spaces or slashes)")
    if role is not None and role not in ROLES:
        raise UserInputError(f"role must be one of {', '.join(ROLES)}, not '{role}'")
    builtin = builtin_for(name)
    if builtin is not None and builtin.name != name:
        name = builtin.name  # a hub id registers the built-in it names
    entry = {
        "path": str(target.expanduser().resolve()),
        "role": role or (builtin.role if builtin else None),
        "architectures": list(architectures) or None,
        "registered_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    entry = {k: v for k, v in entry.items() if v is not None}
    problem = check_model_dir(Path(entry["path"]), expectation_for(name, entry))
    if problem:
        raise UserInputError(f"not registering '{name}': {problem}")
    update_registry(lambda models: models.__setitem__(name, entry), registry)
    return {"name": name, **entry}


def unregister(name: str, registry: Optional[Path] = None) -> Optional[dict]:
    """Remove ``name`` from the registry; returns the removed entry (None if it was not there)."""
    removed: dict = {}

    def change(models: dict[str, dict]) -> None:
        if name in models:
            removed.update(models.pop(name))

    if name not in read_registry(registry):
        return None
    update_registry(change, registry)
    return removed or None


def _safe_registry_names() -> set[str]:
    try:
        return set(read_registry())
    except PreconditionError:
        return set()
