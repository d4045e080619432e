"""Patch: ``vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer`` -- confidence stop.

Why: the EAGLE and draft-model proposers pick each draft token by argmax of the drafter's logits
(``_greedy_sample``) and throw the logits away, so nothing can tell a sure draft from a guess.
Confidence stop (cut a request's draft at its first uncertain position) needs the drafter's top-k
entropy per drafted position.

How: ``_greedy_sample`` is replaced by the same computation (``compute_logits(...).argmax(-1)``)
that also records the top-k entropy of those logits, while a ``propose`` wrapper collects the K
entropies of one call and turns them into a keep length per request (``_confidence``). The drafts
themselves are not changed here: the cut is applied to the lists the runner hands to the
scheduler (patches/gpu_model_runner.py), so verification only sees fewer drafts. Drafting still
costs the batch's K forwards; the saving is in verification. Positions drafted by sampling
(vLLM's probabilistic draft mode), local argmax reduction or heterogeneous vocabularies record no
entropy, and then that step is not cut.

Enabled by: ``adaptive.entropy_stop`` (``--adaptive-entropy-stop``, with ``--adaptive-entropy-topk``,
``--adaptive-entropy-threshold``, ``--adaptive-entropy-scale``); method draft, eagle or eagle3.

Delete when: vLLM proposers expose draft confidences (or per-request early exit) themselves.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Optional

from vspec_runtime.patches import _base, _hooks
from vspec_runtime.patches._confidence import ConfidenceStop
from vspec_runtime.patches.gpu_model_runner import PENDING_CUT

logger = logging.getLogger("vspec.patches")

NAME = "confidence-stop-entropy"
TARGET_MODULE = "vllm.v1.spec_decode.llm_base_proposer"
_PROPOSER = f"{TARGET_MODULE}:SpecDecodeBaseProposer"
SYMBOLS = (
    f"{_PROPOSER}.propose",
    f"{_PROPOSER}._greedy_sample",
    f"{_PROPOSER}.use_local_argmax_reduction",
    f"{_PROPOSER}.use_heterogeneous_vocab",
    f"{_PROPOSER}.vllm_config",
)

_ENTROPIES = "_vspec_draft_entropies"  # list of [requests] tensors while propose() runs
_settings: Optional[ConfidenceStop] = None
_async_warned = False


def install(spec) -> None:
    global _settings
    if not spec.adaptive.entropy_stop:
        return
    if _settings is None:
        _settings = ConfidenceStop.from_spec(spec.adaptive)
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType, settings: Optional[ConfidenceStop] = None) -> bool:
    """Patch the proposer; False when it already is. ``settings`` overrides (tests)."""
    global _settings
    if settings is not None:
        _settings = settings
    _base.check_symbols(NAME, SYMBOLS)
    cls = module.SpecDecodeBaseProposer
    changed = _base.patch_attribute(cls, "_greedy_sample", NAME, _make_greedy_sample)
    changed |= _base.patch_attribute(cls, "propose", NAME, _make_propose)
    return changed


def _make_greedy_sample(original):
    def _greedy_sample(self, hidden_states):
        entropies = getattr(self, _ENTROPIES, None)
        if entropies is None or _settings is None or self.use_local_argmax_reduction or self.use_heterogeneous_vocab:
            return original(self, hidden_states)
        logits = self.model.compute_logits(hidden_states)
        entropies.append(_settings.topk_entropy(logits))
        return logits.argmax(dim=-1)

    return _greedy_sample


def _make_propose(original):
    def propose(self, num_speculative_tokens, *args, **kwargs):
        setattr(self, PENDING_CUT, None)
        if _settings is None:
            return original(self, num_speculative_tokens, *args, **kwargs)
        _warn_if_async(self)
        setattr(self, _ENTROPIES, [])
        try:
            drafts = original(self, num_speculative_tokens, *args, **kwargs)
        finally:
            entropies = getattr(self, _ENTROPIES, None) or []
            setattr(self, _ENTROPIES, None)
        rows = drafts.shape[0] if drafts.ndim == 2 else -1
        complete = (
            drafts.ndim == 2 and drafts.shape[1] > 1 and len(entropies) == drafts.shape[1]
            and all(entropy.shape == (rows,) for entropy in entropies)
        )
        if complete:
            import torch

            keep = _settings.keep_lengths(torch.stack(entropies, dim=1))
            setattr(self, PENDING_CUT, (drafts, keep))
        return drafts

    return propose


def _warn_if_async(proposer) -> None:
    global _async_warned
    if _async_warned:
        return
    _async_warned = True
    scheduler_config = getattr(getattr(proposer, "vllm_config", None), "scheduler_config", None)
    if getattr(scheduler_config, "async_scheduling", False):
        logger.warning("vspec: confidence stop has no effect under async scheduling "
                       "(drafts go to the next step without the scheduler); run with --no-async-scheduling")
