"""Patch: ``vllm.v1.sample.rejection_sampler.rejection_sample`` -- relaxed acceptance.

Why: vLLM verifies greedy drafts by exact match with the target's argmax (rejection_greedy_sample
kernel) and offers no hook to accept near misses. The reference plugin's users trade 2-3 points of
accuracy for about 7% more throughput by accepting a draft whose target logit is within a margin of
the top one (or in the target's top-k).

How: the module function is wrapped. The wrapper computes, from the same processed target logits,
which drafts are inside the margin/top-k, calls vLLM's original (strict) function, then rewrites
only the greedy rows where the relaxed rule accepts more drafts (``_relaxed.relax_greedy_rows``).
Requests that sample keep vLLM's probabilistic verification untouched; synthetic-acceptance mode is
left alone. ``RejectionSampler.forward`` looks the function up in its module at call time, so
replacing the module attribute is enough. Per-request "tokens generated so far" (for the
``after_tokens`` gate) come from the model-runner patch (patches/gpu_model_runner.py).

Enabled by: ``relaxed.margin`` or ``relaxed.topk`` (``--relaxed-margin``,
``--relaxed-topk``; the ``eagle-relaxed`` preset). Off by default; applied in the
process that imports the rejection sampler (the worker), nowhere else.

Delete when: vLLM verification offers a pluggable acceptance rule (or a relaxed-acceptance option
of its own) that sees per-request positions and token counts.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Optional

from vspec_runtime.patches import _base, _hooks
from vspec_runtime.patches._relaxed import (
    RelaxedRule,
    RelaxedStats,
    current_generated_tokens,
    near_top_mask,
    relax_greedy_rows,
)

logger = logging.getLogger("vspec.patches")

NAME = "relaxed-acceptance"
TARGET_MODULE = "vllm.v1.sample.rejection_sampler"
SYMBOLS = (
    f"{TARGET_MODULE}:rejection_sample",
    "vllm.v1.sample.metadata:SamplingMetadata.all_greedy",
    "vllm.v1.sample.metadata:SamplingMetadata.all_random",
    "vllm.v1.sample.metadata:SamplingMetadata.temperature",
)

STATS = RelaxedStats()
_rule: Optional[RelaxedRule] = None


def install(spec) -> None:
    """Arrange for the patch to be applied when (or if already) the rejection sampler is imported."""
    global _rule
    rule = RelaxedRule.from_spec(spec.relaxed)
    if not rule.enabled:
        return
    if _rule is None:
        _rule = rule
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType, rule: Optional[RelaxedRule] = None) -> bool:
    """Patch ``module.rejection_sample``; False when it already is. ``rule`` overrides (tests)."""
    global _rule
    if rule is not None:
        _rule = rule
    _base.check_symbols(NAME, SYMBOLS)
    return _base.patch_attribute(module, "rejection_sample", NAME, _make_wrapper)


def _make_wrapper(original):
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args: Any, **kwargs: Any):
        rule = _rule
        synthetic = kwargs.get("synthetic_mode", args[0] if args else False)
        if (rule is None or not rule.enabled or synthetic or sampling_metadata.all_random
                or draft_token_ids.numel() == 0):
            return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                            target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        # Decide from the logits before vLLM's sampling code may reuse their storage.
        target_argmax = target_logits.argmax(dim=-1)
        near_top = near_top_mask(rule, target_logits, draft_token_ids)
        if sampling_metadata.all_greedy:
            greedy_rows = near_top.new_ones(len(num_draft_tokens))
        else:
            greedy_rows = sampling_metadata.temperature[: len(num_draft_tokens)] == 0
        output = original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                          target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        relaxed_tokens, rows = relax_greedy_rows(
            rule, output, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, target_argmax, near_top,
            bonus_token_ids, greedy_rows, current_generated_tokens())
        STATS.verifications += 1
        if relaxed_tokens:
            if STATS.relaxed_tokens == 0:
                logger.info("vspec: relaxed acceptance accepted its first near-miss drafts "
                            "(outputs now differ from target-only)")
            STATS.relaxed_tokens += relaxed_tokens
            STATS.relaxed_requests += rows
        return output

    return rejection_sample
