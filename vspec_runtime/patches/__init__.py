"""Every change vspec makes to vLLM beyond --scheduler-cls, in one registry; ``apply_all(spec)``.

``vspec_runtime.plugin.register()`` calls ``apply_all`` in every vLLM process once vspec is active.
Each entry names its feature, the module that owns it and when it is enabled; each patch module's
docstring says why it exists, how it works and what would let us delete it (vllm-ascend's
``vllm_ascend/patch/`` is the model). The symbols each one touches are listed in
``vspec_runtime/vllm_surface.py`` (checked by `vspec doctor` and tests/test_vllm_drift.py) and
checked again when the patch is applied; a mismatch raises ``IncompatibleVllm`` naming it.

Patches wait for their target module (``_hooks.when_imported``): they are applied in the process
that imports it (the engine core / worker), so the API server never imports worker code for them.
Applying twice is harmless: a patched attribute carries a marker and is left alone.

  entry                            kind      vLLM target                                      enabled by
  qwen2-eagle-models               register  ModelRegistry (Qwen2ForCausalLMEagle + aliases)  always when active
  confidence-stop-entropy          patch     SpecDecodeBaseProposer._greedy_sample, .propose  adaptive.entropy_stop
  confidence-stop-trim             patch     GPUModelRunner.take_draft_token_ids              adaptive.entropy_stop
  relaxed-acceptance               patch     rejection_sampler.rejection_sample               relaxed.margin or .topk
  relaxed-acceptance-token-counts  patch     GPUModelRunner._sample                           relaxed, after_tokens > 0
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Callable

from vspec_runtime.patches._base import IncompatibleVllm

logger = logging.getLogger("vspec.patches")

__all__ = ["REGISTRY", "Extension", "IncompatibleVllm", "apply_all", "enabled_for"]


@dataclass(frozen=True)
class Extension:
    name: str
    kind: str  # "register" (a supported vLLM extension point) or "patch"
    module: str  # the vspec module that owns it
    install: str  # function in that module, called with the RuntimeSpec
    enabled: Callable[[object], bool]
    why: str


def _always(spec) -> bool:
    return True


def _entropy_stop(spec) -> bool:
    return bool(spec.adaptive.entropy_stop)


def _relaxed(spec) -> bool:
    return bool(spec.relaxed.enabled)


def _relaxed_after_tokens(spec) -> bool:
    return bool(spec.relaxed.enabled and spec.relaxed.after_tokens > 0)


REGISTRY: tuple[Extension, ...] = (
    Extension("qwen2-eagle-models", "register", "vspec_runtime.models", "register_models", _always,
              "Qwen2 EAGLE-1 heads (Qwen2ForCausalLMEagle), dropped from vLLM"),
    Extension("confidence-stop-entropy", "patch", "vspec_runtime.patches.llm_base_proposer", "install",
              _entropy_stop, "drafter top-k entropy per position -> keep length per request"),
    Extension("confidence-stop-trim", "patch", "vspec_runtime.patches.gpu_model_runner",
              "install_confidence_stop", _entropy_stop, "trim each request's drafts before the scheduler"),
    Extension("relaxed-acceptance", "patch", "vspec_runtime.patches.rejection_sampler", "install", _relaxed,
              "accept near-miss greedy drafts (changes outputs)"),
    Extension("relaxed-acceptance-token-counts", "patch", "vspec_runtime.patches.gpu_model_runner",
              "install_generated_counts", _relaxed_after_tokens, "tokens generated per request, for the gate"),
)

_applied: set[str] = set()


def enabled_for(spec) -> list[Extension]:
    return [extension for extension in REGISTRY if extension.enabled(spec)]


def apply_all(spec) -> list[str]:
    """Install every extension the spec enables; returns their names. Safe to call again."""
    enabled = enabled_for(spec)
    for extension in enabled:
        if extension.name not in _applied:
            module = importlib.import_module(extension.module)
            getattr(module, extension.install)(spec)
            _applied.add(extension.name)
    patched = [extension.name for extension in enabled if extension.kind == "patch"]
    if patched:
        logger.info("vspec patches enabled: %s (applied when vLLM imports their modules)", ", ".join(patched))
    return [extension.name for extension in enabled]
