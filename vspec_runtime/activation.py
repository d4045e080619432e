"""Is vspec active in this process, and with which spec?

Active when ``VSPEC_SPEC`` is set (by `vspec serve`, `vspec bench`, `vspec profile`) or when the
operator ran `vspec enable` (the state file's ``enabled = true``) for servers started with plain
`vllm serve`; those get the default adaptive settings of the state file's optional [runtime] table.
Inert otherwise: a plain `vllm serve` with vspec installed behaves exactly as without it.
"""

from __future__ import annotations

import functools
import tomllib
from typing import Optional

from vspec_runtime import envs, paths
from vspec_runtime.spec import RuntimeSpec, SpecError, validate_spec


class ActivationError(RuntimeError):
    """The vspec environment is set but unusable: fail fast with a clear message."""


def enabled_in_state_file() -> tuple[bool, dict]:
    path = paths.state_file()
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False, {}
    return bool(document.get("enabled", False)), dict(document.get("runtime", {}))


@functools.lru_cache(maxsize=1)
def active_spec() -> Optional[RuntimeSpec]:
    """The spec this process runs with, or None when vspec is inert. Cached: parsed once."""
    raw = envs.get("VSPEC_SPEC")
    if raw:
        try:
            return RuntimeSpec.from_json(raw)
        except SpecError as exc:
            raise ActivationError(f"VSPEC_SPEC is invalid: {exc}") from None
    enabled, runtime_table = enabled_in_state_file()
    if not enabled:
        return None
    # Enabled for plain `vllm serve`: the scheduler reads vLLM's own speculative config; this spec
    # only carries the controller settings (target_model is informational).
    data = {"target_model": "(plain vllm serve)", "adaptive": {"enabled": True}, **runtime_table}
    try:
        return validate_spec(data, source=str(paths.state_file()))
    except SpecError as exc:
        raise ActivationError(f"the [runtime] table of the vspec state file is invalid: {exc}") from None
