"""Patches: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` (the CPU runner subclasses it).

Two small wrappers on the model runner, each enabled by its own feature:

``take_draft_token_ids`` -- confidence stop, the per-request cut.
  Why: vLLM drafts K tokens for every request of the batch and hands them to the scheduler as
  lists; nothing lets a request keep fewer. The proposer patch (patches/llm_base_proposer.py)
  decides, per request, how many drafts to keep; this wrapper trims the lists it returns to the
  scheduler, so the scheduler verifies only the kept drafts (vLLM's own draft counters drop) and
  the AdaptiveScheduler can count the cuts for the trace (it sees lists shorter than the K it
  asked for; nothing else shortens them before ``update_draft_token_ids``).
  Enabled by: ``adaptive.entropy_stop`` (``--adaptive-entropy-stop``). Takes effect with vLLM's
  synchronous scheduling (CPU; GPU without async scheduling): under async scheduling the runner
  feeds its drafts to the next step itself and the proposer patch logs that the cut is inert.
  Delete when: vLLM lets a drafter return per-request draft lengths (it already does for the GPU
  n-gram drafter, ``_num_valid_draft_tokens``), or calls a scheduler hook with draft confidences.

``_sample`` -- relaxed acceptance, the ``after_tokens`` gate.
  Why: the verification function (patches/rejection_sampler.py) sees tensors only, not how many
  tokens each request has generated. This wrapper publishes that count, per request in batch
  order, for the duration of the call (a context variable; nothing is stored on vLLM's objects).
  Enabled by: relaxed acceptance with ``relaxed.after_tokens > 0``.
  Delete when: the rejection sampler's inputs carry per-request output lengths, or the relaxed
  rule moves into vLLM.
"""

from __future__ import annotations

import logging
from types import ModuleType

from vspec_runtime.patches import _base, _hooks
from vspec_runtime.patches._confidence import trim_drafts
from vspec_runtime.patches._relaxed import generated_tokens

logger = logging.getLogger("vspec.patches")

TARGET_MODULE = "vllm.v1.worker.gpu_model_runner"
_RUNNER = f"{TARGET_MODULE}:GPUModelRunner"

CONFIDENCE_NAME = "confidence-stop-trim"
CONFIDENCE_SYMBOLS = (
    f"{_RUNNER}.take_draft_token_ids",
    f"{_RUNNER}.drafter",
    f"{_RUNNER}._draft_token_ids",
    "vllm.v1.outputs:DraftTokenIds.draft_token_ids",
)

GENERATED_NAME = "relaxed-acceptance-token-counts"
GENERATED_SYMBOLS = (
    f"{_RUNNER}._sample",
    f"{_RUNNER}.input_batch",
    "vllm.v1.worker.gpu_input_batch:InputBatch.num_reqs",
    "vllm.v1.worker.gpu_input_batch:InputBatch.num_tokens_no_spec",
    "vllm.v1.worker.gpu_input_batch:InputBatch.num_prompt_tokens",
)

# The attribute the proposer patch leaves on the drafter: (draft tensor, keep lengths tensor).
PENDING_CUT = "_vspec_pending_cut"


# --- confidence stop -------------------------------------------------------------------------


def install_confidence_stop(spec) -> None:
    if spec.adaptive.entropy_stop:
        _hooks.when_imported(TARGET_MODULE, apply_confidence_stop)


def apply_confidence_stop(module: ModuleType) -> bool:
    _base.check_symbols(CONFIDENCE_NAME, CONFIDENCE_SYMBOLS)
    return _base.patch_attribute(module.GPUModelRunner, "take_draft_token_ids", CONFIDENCE_NAME, _make_take)


def _make_take(original):
    def take_draft_token_ids(self):
        result = original(self)
        drafter = getattr(self, "drafter", None)
        pending = getattr(drafter, PENDING_CUT, None)
        if pending is None:
            return result
        setattr(drafter, PENDING_CUT, None)
        drafts, keep = pending
        # Only the drafts the cut was computed for: the runner replaces them (zeros) when the
        # drafter was skipped this step.
        if result is not None and drafts is self._draft_token_ids:
            trim_drafts(result.draft_token_ids, keep.tolist())
        return result

    return take_draft_token_ids


# --- relaxed acceptance: tokens generated so far ---------------------------------------------


def install_generated_counts(spec) -> None:
    if spec.relaxed.enabled and spec.relaxed.after_tokens > 0:
        _hooks.when_imported(TARGET_MODULE, apply_generated_counts)


def apply_generated_counts(module: ModuleType) -> bool:
    _base.check_symbols(GENERATED_NAME, GENERATED_SYMBOLS)
    return _base.patch_attribute(module.GPUModelRunner, "_sample", GENERATED_NAME, _make_sample)


def _make_sample(original):
    def _sample(self, logits, spec_decode_metadata, *args, **kwargs):
        if spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata, *args, **kwargs)
        batch = self.input_batch
        count = batch.num_reqs
        generated = (batch.num_tokens_no_spec[:count] - batch.num_prompt_tokens[:count]).tolist()
        with generated_tokens(generated):
            return original(self, logits, spec_decode_metadata, *args, **kwargs)

    return _sample
