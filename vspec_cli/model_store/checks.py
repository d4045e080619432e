"""What a folder must hold to serve as a model (Expectation, expectation_for, check_model_dir), and
whether a command-line word is a path rather than a model name (looks_like_path)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from vspec_cli.model_store.catalog import TOKENIZER_FILES, WEIGHT_SUFFIXES, BuiltinModel, builtin_for


def looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or os.sep in text and Path(text).exists()


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
