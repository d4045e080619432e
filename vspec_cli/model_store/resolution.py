"""Finding a usable local copy of a model: the candidate places in resolution order (Candidate,
candidates), resolve and require_local, the names vspec knows, and the per-model reports of
`vspec models list/verify` (ModelReport, report, list_models)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.model_store.catalog import BUILTIN_MODELS, builtin_for, packaged_dir
from vspec_cli.model_store.checks import check_model_dir, expectation_for, looks_like_path
from vspec_cli.model_store.registry import _safe_registry_names, read_registry
from vspec_runtime import envs, paths


@dataclass(frozen=True)
class Resolved:
    name: str
    path: Optional[Path]  # None when nothing valid was found
    source: str  # path | env | registry | model-dir | shared | packaged | missing
    problem: Optional[str] = None  # why the best candidate was rejected, when path is None


@dataclass(frozen=True)
class Candidate:
    source: str
    path: Path
    exists: bool
    problem: Optional[str]  # None: valid


@dataclass(frozen=True)
class ModelReport:
    """Everything `vspec models list/verify` shows about one name."""

    name: str
    role: Optional[str]
    builtin: bool
    hub_repo: Optional[str]
    revision: str
    status: str  # ok | missing | invalid
    source: str
    path: Optional[str]
    problem: Optional[str]
    candidates: list[dict] = field(default_factory=list)


def _candidates(name: str, registry: Optional[Path] = None) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    override = os.environ.get(envs.model_override_var(name))
    if override:
        found.append(("env", Path(override).expanduser()))
    entry = read_registry(registry).get(name)
    if entry:
        found.append(("registry", Path(entry["path"]).expanduser()))
    found.append(("model-dir", paths.model_dir() / name))
    found.extend(("shared", shared / name) for shared in paths.shared_model_dirs())
    builtin = builtin_for(name)
    if builtin is not None and builtin.packaged:
        found.append(("packaged", packaged_dir(builtin.packaged)))
    return found


def candidates(name: str, registry: Optional[Path] = None) -> list[Candidate]:
    """Every place ``name`` could come from, in resolution order, each validated."""
    builtin = builtin_for(name)
    name = builtin.name if builtin else name
    expect = expectation_for(name, read_registry(registry).get(name))
    result = []
    for source, path in _candidates(name, registry):
        exists = path.exists()
        result.append(Candidate(source, path, exists, check_model_dir(path, expect) if exists else f"{path} does not exist"))
    return result


def resolve(name_or_path: str, registry: Optional[Path] = None) -> Resolved:
    """Find a usable local copy. An explicit path is taken as given when it exists."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser().resolve()
        return Resolved(name_or_path, path if path.exists() else None, "path" if path.exists() else "missing",
                        None if path.exists() else f"{path} does not exist")
    builtin = builtin_for(name_or_path)
    name = builtin.name if builtin else name_or_path
    first_problem = None
    for candidate in candidates(name, registry):
        if not candidate.exists:
            # A registry entry or override that points nowhere is worth reporting; a missing
            # default folder is just "not prepared".
            if candidate.source in ("env", "registry"):
                first_problem = first_problem or f"{candidate.source}: {candidate.problem}"
            continue
        if candidate.problem is None:
            return Resolved(name, candidate.path, candidate.source)
        first_problem = first_problem or candidate.problem
    return Resolved(name, None, "missing", first_problem)


def is_known_name(text: str) -> bool:
    return builtin_for(text) is not None or text in _safe_registry_names()


def known_names(registry: Optional[Path] = None) -> list[str]:
    """Built-ins, registered names and folders in the model directory, sorted."""
    names = set(BUILTIN_MODELS)
    try:
        names |= set(read_registry(registry))
    except PreconditionError:
        pass
    model_dir = paths.model_dir()
    if model_dir.is_dir():
        names |= {p.name for p in model_dir.iterdir() if not p.name.startswith(".") and p.is_dir()}
    return sorted(names)


def require_local(name_or_path: str, what: str) -> Path:
    """A usable local path for ``name_or_path`` or a clear error naming it and `vspec models`."""
    resolved = resolve(name_or_path)
    if resolved.path is not None:
        return resolved.path
    if looks_like_path(name_or_path):
        raise UserInputError(
            f"{what} path {name_or_path} does not exist",
            hint="check the path, or run `vspec models list` for the models vspec knows",
        )
    reason = f" ({resolved.problem})" if resolved.problem else ""
    raise PreconditionError(
        f"{what} '{resolved.name}' is not available locally{reason}",
        hint=f"run `vspec models prepare {resolved.name}` or `vspec models register {resolved.name} PATH`",
    )


def describe(resolved: Resolved) -> dict:
    data = asdict(resolved)
    data["path"] = str(resolved.path) if resolved.path else None
    return data


def report(name: str, registry: Optional[Path] = None) -> ModelReport:
    builtin = builtin_for(name)
    name = builtin.name if builtin else name
    entry = read_registry(registry).get(name) or {}
    found = candidates(name, registry)
    resolved = resolve(name, registry)
    present = [c for c in found if c.exists or c.source in ("env", "registry")]
    status = "ok" if resolved.path else ("invalid" if resolved.problem else "missing")
    return ModelReport(
        name=name,
        role=builtin.role if builtin else entry.get("role"),
        builtin=builtin is not None,
        hub_repo=builtin.hub_repo if builtin else None,
        revision=builtin.revision_label if builtin else "local",
        status=status,
        source=resolved.source,
        path=str(resolved.path) if resolved.path else None,
        problem=resolved.problem,
        candidates=[{"source": c.source, "path": str(c.path), "problem": c.problem} for c in present],
    )


def list_models(registry: Optional[Path] = None) -> list[ModelReport]:
    return [report(name, registry) for name in known_names(registry)]
