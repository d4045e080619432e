"""Presets and config files: TOML documents with the RuntimeSpec's shape.

Schema (unknown keys are errors; every key is optional in a --config file):

    description = "one line"          # presets only; shown by `vspec serve --list-presets`
    method = "ngram" | "draft" | "eagle" | "eagle3" | "none"
    target_model = "demo"             # a `vspec models` name, a local path or a hub id
    drafter = "qwen2.5-0.5b-instruct" # draft/eagle/eagle3 only
    gamma = 6                         # maximum K (vLLM's num_speculative_tokens)
    ngram_min = 1 ; ngram_max = 4     # ngram only
    [adaptive]  enabled, policy, profile, min_gamma, max_gamma_step, control_interval, hysteresis,
                online_window, online_exploration, model_guided, batch_acceptance, token_costs, coverage_weighting,
                acceptance_model, visit_value, firm_up_follow_through, batch_normalized_costs, start_gamma,
                gamma0_mode, gamma0_reprobe_steps, fixed_gamma, table (batch size -> K), trace, samples,
                sweep_gammas, seed, per_request, entropy_stop, entropy_topk, entropy_threshold,
                entropy_scale
    [relaxed]   margin, topk, from_position, after_tokens, protected_token_ids
    [serving]   host, port, device, max_num_seqs, max_model_len, max_num_batched_tokens, dtype,
                gpu_memory_utilization, served_model_name, extra_args

Precedence: preset < config file (--config or VSPEC_CONFIG) < command-line flags.
"""

from __future__ import annotations

import copy
import importlib.resources
import tomllib
from pathlib import Path
from typing import Any, Optional

from vspec_cli._errors import UserInputError

PRESET_PACKAGE = "vspec_presets"
PRESET_ONLY_KEYS = ("description",)


def _preset_files() -> dict[str, Any]:
    root = importlib.resources.files(PRESET_PACKAGE)
    return {entry.name.removesuffix(".toml"): entry for entry in root.iterdir() if entry.name.endswith(".toml")}


def preset_names() -> list[str]:
    return sorted(_preset_files())


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserInputError(f"{source}: not valid TOML ({exc})") from None


def load_preset(name_or_path: str) -> tuple[dict[str, Any], str]:
    """The preset's settings (description removed) and where they came from."""
    files = _preset_files()
    if name_or_path in files:
        entry = files[name_or_path]
        data = _parse_toml(entry.read_text(encoding="utf-8"), f"preset '{name_or_path}'")
        source = f"preset '{name_or_path}'"
    elif name_or_path.endswith(".toml") and Path(name_or_path).is_file():
        data = _parse_toml(Path(name_or_path).read_text(encoding="utf-8"), name_or_path)
        source = name_or_path
    else:
        raise UserInputError(
            f"unknown preset '{name_or_path}' (known: {', '.join(preset_names())})",
            hint="run `vspec serve --list-presets`, or pass a .toml file",
        )
    for key in PRESET_ONLY_KEYS:
        data.pop(key, None)
    return data, source


def preset_description(name: str) -> str:
    entry = _preset_files()[name]
    return str(tomllib.loads(entry.read_text(encoding="utf-8")).get("description", ""))


def load_config_file(path: Optional[str]) -> tuple[dict[str, Any], Optional[str]]:
    if not path:
        return {}, None
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserInputError(f"config file {path} does not exist")
    data = _parse_toml(file.read_text(encoding="utf-8"), str(path))
    for key in PRESET_ONLY_KEYS:
        data.pop(key, None)
    return data, str(path)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` wins key by key; tables merge recursively; lists are replaced, not appended."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
