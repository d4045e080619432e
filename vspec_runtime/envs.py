"""Every ``VSPEC_*`` environment variable in one place: its name, parser and why it exists.

The CLI sets some of them for the vLLM processes it launches; operators set others. `vspec doctor`
and docs/envs.md (generated from ENV_VARS, checked by a test) list them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str], object]
    doc: str


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar("VSPEC_SPEC", str, "The runtime spec as JSON. Set by `vspec serve`; its presence activates the plugin."),
        EnvVar("VSPEC_RUN_DIR", str, "Folder for this server's live controller state (read by the /metrics collector). Set by the plugin if missing."),
        EnvVar("VSPEC_CONFIG", str, "A TOML config file applied on top of the preset (same schema); `--config` wins."),
        EnvVar("VSPEC_HOME", str, "Base folder for vspec's state, registry and models (default: the XDG folders)."),
        EnvVar("VSPEC_MODEL_DIR", str, "Where prepared and downloaded models live (default: $XDG_DATA_HOME/vspec/models)."),
        EnvVar("VSPEC_SHARED_MODEL_DIRS", str, "Extra read-only model folders, separated by ':' (searched last)."),
        EnvVar("VSPEC_REGISTRY", str, "Path of the model registry JSON (default: $XDG_CONFIG_HOME/vspec/models.json)."),
        EnvVar("VSPEC_STATE_FILE", str, "Path of the install/enable state TOML (default: $XDG_CONFIG_HOME/vspec/state.toml)."),
        EnvVar("VSPEC_DEBUG", _flag, "Show Python tracebacks for errors (1/true)."),
        EnvVar("VSPEC_DISABLE_PATCHES", lambda text: tuple(n.strip() for n in text.split(",") if n.strip()),
               "Comma-separated extension names (docs/patches.md) to leave out, to check whether upstream still needs them. Leaving out `cpu-expand-kernel` brings back junk sampled outputs on CPU."),
        EnvVar("VSPEC_BENCH_POLICIES", str, "Set by `vspec bench` (interleaved mode): JSON {label: {gamma, adaptive}} of the policies one engine switches between; the active label is read from the file `bench-policy` in VSPEC_RUN_DIR whenever the engine goes idle."),
        EnvVar("VSPEC_FAULT_AFTER_STEPS", int, "Test hook: the policy raises after this many decisions, to exercise fault isolation."),
    )
}


def get(name: str, default: Optional[object] = None) -> object:
    """The parsed value of a registered variable, or ``default`` when unset or empty."""
    var = ENV_VARS[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return var.parse(raw)


def model_override_var(model_name: str) -> str:
    """Per-model path override, e.g. VSPEC_MODEL_PATH_DEMO or VSPEC_MODEL_PATH_QWEN2_5_0_5B_INSTRUCT."""
    slug = "".join(ch if ch.isalnum() else "_" for ch in model_name.upper())
    return f"VSPEC_MODEL_PATH_{slug}"


def render_markdown() -> str:
    """docs/envs.md, generated from ENV_VARS (tests fail when the checked-in copy is stale)."""
    lines = [
        "# Environment variables",
        "",
        "Generated from `vspec_runtime/envs.py` by `python -m vspec_runtime.envs > docs/envs.md`.",
        "",
        "| variable | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{var.name}` | {var.doc} |" for var in ENV_VARS.values()]
    lines.append(f"| `VSPEC_MODEL_PATH_<NAME>` | Path override for one model name, e.g. `{model_override_var('demo')}`. |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
