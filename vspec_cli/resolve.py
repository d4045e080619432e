"""Preset + config file + flags -> one validated RuntimeSpec, and its models -> local paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from vspec_cli import model_store
from vspec_cli._errors import UserInputError
from vspec_cli.presets import deep_merge, load_config_file, load_preset
from vspec_runtime.spec import RuntimeSpec, SpecError, layer_problem, validate_spec


@dataclass(frozen=True)
class ModelPaths:
    target: str
    drafter: Optional[str]
    notes: tuple[str, ...] = ()


def resolve_spec(
    preset: Optional[str],
    config_file: Optional[str],
    flag_overrides: dict[str, Any],
    no_speculation: bool = False,
) -> RuntimeSpec:
    """Apply precedence preset < config file < flags, then validate once."""
    layers: list[tuple[dict[str, Any], str]] = []
    if preset:
        layers.append(load_preset(preset))
    config, config_source = load_config_file(config_file)
    if config_source:
        layers.append((config, config_source))
    if flag_overrides:
        layers.append((flag_overrides, "command-line flags"))
    if no_speculation:
        # Target-only for comparisons: no speculative config, no controller, no drafter.
        layers.append(({"method": "none", "drafter": None, "adaptive": {"enabled": False}}, "--no-speculation"))

    merged: dict[str, Any] = {}
    for data, source in layers:
        if not isinstance(data, dict):
            raise UserInputError(f"{source}: expected a TOML table")
        _check_sections(data, source)
        merged = deep_merge(merged, data)
    if not merged.get("target_model"):
        raise UserInputError(
            "no target model: give a preset (e.g. `vspec serve demo`) or --target-model PATH",
        )
    try:
        spec = validate_spec(merged)
    except SpecError as exc:
        raise UserInputError(str(exc)) from None
    _preflight_profile(spec)
    return spec


def _preflight_profile(spec: RuntimeSpec) -> None:
    """A bad profile stops the command here, in one line, not inside the engine after the model loaded."""
    if spec.adaptive_active and spec.adaptive.policy == "profile" and spec.adaptive.profile:
        from vspec_cli.profiling.files import load_profile_file

        load_profile_file(Path(spec.adaptive.profile), serving_max_gamma=spec.gamma)


def _check_sections(data: dict[str, Any], source: str) -> None:
    problem = layer_problem(data, source)
    if problem:
        raise UserInputError(problem)


def resolve_model_paths(
    spec: RuntimeSpec,
    strict: bool,
    prepare_demo: Optional[Callable[[], Path]] = None,
) -> ModelPaths:
    """Local paths for the target and drafter.

    ``strict`` (a real launch): every model must exist locally, except plain hub ids vLLM fetches
    itself. Not strict (dry run): an unprepared built-in falls back to its hub id with a note.
    """
    notes: list[str] = []
    target = _one_path(spec.target_model, "target model", strict, notes, prepare_demo)
    drafter = _one_path(spec.drafter, "drafter", strict, notes, None) if spec.drafter else None
    return ModelPaths(target=target, drafter=drafter, notes=tuple(notes))


def _one_path(text: str, what: str, strict: bool, notes: list[str], prepare_demo) -> str:
    resolved = model_store.resolve(text)
    builtin = model_store.builtin_for(text)
    if resolved.path is not None:
        if builtin is not None and builtin.builder == "smollm2-gguf":
            from vspec_cli.demo_model import refresh_built_demo

            refresh_built_demo(resolved.path)
        return str(resolved.path)
    if model_store.looks_like_path(text):
        raise UserInputError(
            f"{what} path {text} does not exist",
            hint="check the path, or run `vspec models list` for the models vspec knows",
        )
    if builtin is not None and builtin.builder == "smollm2-gguf" and prepare_demo is not None:
        return str(prepare_demo())
    if strict and model_store.is_known_name(text):
        return str(model_store.require_local(text, what))
    hub_id = builtin.hub_repo if builtin and builtin.hub_repo else text
    if builtin is not None or model_store.is_known_name(text):
        notes.append(f"{what} '{text}' is not prepared here; a real launch needs `vspec models prepare {resolved.name}`")
    else:
        notes.append(f"{what} '{text}' is not a local model; vLLM will look it up on the hub as '{hub_id}'")
    return hub_id
