"""`vspec models remove`: forgetting a model (Removed, remove) without touching folders outside
vspec's model directory."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vspec_cli._errors import UserInputError
from vspec_cli.model_store.catalog import builtin_for
from vspec_cli.model_store.registry import read_registry, unregister
from vspec_runtime import paths


@dataclass(frozen=True)
class Removed:
    name: str
    registry_entry: Optional[dict]
    deleted: Optional[str]  # what was deleted from the model directory
    kept: list[str]  # folders left alone (outside vspec's model directory)


def remove(name: str, delete_files: bool = False, registry: Optional[Path] = None, dry_run: bool = False) -> Removed:
    """Forget ``name``: its registry entry, and with ``delete_files`` its copy in vspec's model dir.

    Never deletes anything outside the model directory (registered folders are the user's); for a
    link into the huggingface cache only the link goes.
    """
    builtin = builtin_for(name)
    name = builtin.name if builtin else name
    entry = read_registry(registry).get(name)
    local = paths.model_dir() / name
    has_local = local.exists() or local.is_symlink()
    if entry is None and not has_local:
        raise UserInputError(f"'{name}' is neither registered nor in {paths.model_dir()}",
                             hint="run `vspec models list` to see what is there")
    kept = [entry["path"]] if entry else []
    deleted = None
    if has_local:
        if delete_files:
            deleted = str(local)
            if local.is_symlink():  # a link into the huggingface cache: the cache keeps its copy
                kept.append(f"{local.resolve()} (huggingface cache)")
            if not dry_run:
                if local.is_symlink() or local.is_file():
                    local.unlink()
                else:
                    shutil.rmtree(local)
        else:
            kept.append(str(local))
    if entry is not None and not dry_run:
        unregister(name, registry)
    return Removed(name, entry, deleted, kept)
