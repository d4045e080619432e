"""Patch: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` -- K=0 serves at target-only cost.

Why: when the controller turns speculation off (K=0), vLLM 0.32 still runs the speculative path
every step. Profiled on the demo (cProfile of the engine core, chat at batch 8, 288 steps; the
table is in docs/benchmarks.md), the steps at K=0 cost about 1 s more than target-only's, in:
the rejection sampler with zero drafts (its bonus-token sampler plus the empty rejection pass,
0.26 s more than the plain sampler), the n-gram drafter searching every request's context for K=0
tokens (0.11 s), vspec's own per-step work (0.1 s, mostly the metrics snapshot) and the
speculative input preparation (0.1 s).

How: wrappers on the model runner, ``_prepare_inputs``, ``_sample``, ``propose_draft_token_ids`` and
``take_draft_token_ids``:

``_prepare_inputs``: when the step verifies no drafts (``scheduled_spec_decode_tokens`` empty) and its
  drafter reads no spec-decode metadata (the n-gram drafter, or a model drafter this step skips, below),
  vLLM's inputs are prepared as without speculation: the same logits rows (each request's last token)
  and no ``SpecDecodeMetadata``, whose index arithmetic and five host-to-device copies (profiled at 0.04 s
  of the 288 steps, about 15% of K=0's remaining per-step Python) buy nothing at zero drafts. vLLM picks
  its branch by ``speculative_config is not None``, so the wrapper hides the runner's config for that
  one call. Not for models with recurrent state (Mamba, GDN: ``model_config.has_inner_state``): their
  attention builders read the per-request draft counts that branch writes.
``_sample``: when no request of the step has drafts (``SpecDecodeMetadata.num_draft_tokens`` all 0), the
  plain sampler runs instead of the rejection sampler. With zero drafts the rejection sampler only
  samples the bonus token with the same sampler on the same logits (the spec-token list it merges
  for penalties is empty), and its output has the same shape ([requests, 1]): the same tokens for
  greedy requests, the same distribution for sampled ones. It serves the steps without drafts that
  ``_prepare_inputs`` (above) leaves on vLLM's speculative path: a model drafter's pass runs (K comes
  back next step, ``gamma0_mode = "sync"``, a prompt step under prefix caching) or the model has
  recurrent state. With n-gram drafting every such step, K=0 or not (text without repeats), takes
  the plain path before it.
``propose_draft_token_ids`` with the n-gram drafter at K=0: the drafter is
  not asked: every request gets an empty draft list, which is what it returns at K=0. The n-gram
  drafter keeps no state between steps, so nothing has to catch up when K comes back.

``propose_draft_token_ids`` with a model drafter (draft model, EAGLE) at K=0: vLLM still runs the
  drafter's first forward pass over the step's tokens (``propose`` returns no drafts after it),
  because that pass writes the drafter's own KV cache (and, for EAGLE, consumes the target's hidden
  states, which no later step could recompute). With a drafter a quarter the target's size that
  pass alone costs a quarter of a target step, so a K=0 that keeps it cannot reach target-only
  speed. vspec skips it under the sticky K=0 rule (``adaptive.gamma0_mode = "sticky"``, the
  default): once the controller picks K=0 for a model drafter it holds K=0 for the cohort
  (vspec_runtime/control/sticky.py: until the batch drains, or a re-probe under continuous load),
  and a request the drafter skipped never drafts again (``take_draft_token_ids`` below), so the
  drafter's stale cache for it is never used. With prefix caching on (as `vspec serve` runs) only
  pure decode steps are skipped: a step with prompt tokens still runs the drafter, so prompt blocks
  that prefix caching hands to later requests hold the drafter's values. With prefix caching off
  nobody reuses those blocks, and a step with prompt tokens is skipped too: the requests it admits
  into the cohort never draft, so their prompt pass was pure cost (on the demo's chat at batch 8
  with a drafter of 8 of the target's 30 layers, about 5% of the run; docs/benchmarks.md, "The
  useless drafter"). What is left behind is the drafter's cache for tokens generated during a cohort: a later
  request whose prompt contains them through a prefix-cache hit (a multi-turn conversation) drafts
  from that stale context; its drafts are rejected more often, its outputs are still exact. A
  controller fault inside a cohort resumes drafting (K frozen at 1 or more) with the same effect.
``take_draft_token_ids``: the requests that were running when the drafter was skipped are
  remembered (until they finish or are preempted, which recomputes them); when K comes back before
  they finish (a re-probe under continuous load, ``adaptive.gamma0_reprobe_steps``), their drafts
  are dropped before the scheduler sees them, so nothing built on a stale cache is verified.
  Requests admitted since then draft normally.
  With ``gamma0_mode = "sync"`` (the policy asked every step, K back whenever it pays) vLLM's pass
  runs as before, so the cache is always current.
  Not under asynchronous scheduling: there the drafter's pass also hands the next step its input
  tokens and the accepted counts (vLLM's ``_copy_valid_sampled_token_count``, called from
  ``propose_draft_token_ids``), so skipping it would break the next step; vLLM's K=0 pass runs and a
  warning says the skip is off (``--no-async-scheduling`` brings it back).

Enabled by: adaptive K (``adaptive.enabled``): only vspec's scheduler picks K=0 per step, and
vLLM's own fixed-K path (``vspec bench``'s ``vllm-fixed:K`` baseline) stays as vLLM ships it.

Delete when: vLLM's model runner skips the rejection sampler when a step has no drafts and the
drafter call at K=0 (vLLM's dynamic-SD work), checked with `vspec bench --policies
target-only,table:1=0` (K=0 against target-only); tests/test_runtime_integration.py checks
the outputs and that each path is taken.
"""

from __future__ import annotations

import logging
from types import ModuleType

from vspec_runtime import vllm_adapter
from vspec_runtime.control.sticky import skips_drafter
from vspec_runtime.patches import _base, _hooks

logger = logging.getLogger("vspec.patches")

NAME = "k0-fast-path"
TARGET_MODULE = "vllm.v1.worker.gpu_model_runner"
_RUNNER = f"{TARGET_MODULE}:GPUModelRunner"
SYMBOLS = (
    f"{_RUNNER}._sample",
    f"{_RUNNER}._prepare_inputs",
    f"{_RUNNER}.model_config",
    "vllm.config.model:ModelConfig.has_inner_state",
    f"{_RUNNER}.propose_draft_token_ids",
    f"{_RUNNER}.speculative_config",
    "vllm.v1.spec_decode.metadata:SpecDecodeMetadata.num_draft_tokens",
    "vllm.v1.core.sched.output:SchedulerOutput.num_spec_tokens_to_schedule",
    "vllm.config.speculative:SpeculativeConfig.method",
    f"{_RUNNER}.use_async_scheduling",
    f"{_RUNNER}.cache_config",
    "vllm.config.cache:CacheConfig.enable_prefix_caching",
    f"{_RUNNER}.take_draft_token_ids",
    f"{_RUNNER}.input_batch",
    "vllm.v1.worker.gpu_input_batch:InputBatch.req_ids",
    "vllm.v1.core.sched.output:SchedulerOutput.finished_req_ids",
    "vllm.v1.core.sched.output:SchedulerOutput.preempted_req_ids",
    "vllm.v1.outputs:DraftTokenIds.req_ids",
    "vllm.v1.outputs:DraftTokenIds.draft_token_ids",
    "vllm.v1.core.sched.output:SchedulerOutput.scheduled_new_reqs",
    "vllm.v1.core.sched.output:SchedulerOutput.num_scheduled_tokens",
    "vllm.v1.core.sched.output:SchedulerOutput.scheduled_spec_decode_tokens",
)

# Drafters that keep no state between steps: skipping them at K=0 loses nothing.
STATELESS_METHODS = ("ngram",)


def install(spec) -> None:
    skip_model_drafters = spec.adaptive.gamma0_mode == "sticky"
    _hooks.when_imported(TARGET_MODULE, lambda module: apply(module, skip_model_drafters))


def apply(module: ModuleType, skip_model_drafters: bool = True) -> bool:
    _base.check_symbols(NAME, SYMBOLS)
    runner = module.GPUModelRunner
    sampled = _base.patch_attribute(runner, "_sample", NAME, _make_sample)
    prepared = _base.patch_attribute(runner, "_prepare_inputs", NAME,
                                     lambda original: _make_prepare_inputs(original, skip_model_drafters))
    proposed = _base.patch_attribute(runner, "propose_draft_token_ids", NAME,
                                     lambda original: _make_propose(original, skip_model_drafters))
    taken = _base.patch_attribute(runner, "take_draft_token_ids", NAME, _make_take)
    return sampled or prepared or proposed or taken


def _announce(what: str) -> None:
    """One log line per path and process, the first time a step takes it."""
    if _base.first_time(f"{NAME}: {what}"):
        logger.info("vspec patch %s live: %s", NAME, what)


def _make_sample(original):
    def _sample(self, logits, spec_decode_metadata, *args, **kwargs):
        if spec_decode_metadata is not None and not any(spec_decode_metadata.num_draft_tokens):
            spec_decode_metadata = None  # no drafts in this step: the plain sampler is the same draw
            _announce("a step without drafts was sampled without the rejection sampler")
        return original(self, logits, spec_decode_metadata, *args, **kwargs)

    return _sample


def _make_prepare_inputs(original, skip_model_drafters: bool):
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        if (scheduler_output.scheduled_spec_decode_tokens or self.model_config.has_inner_state
                or not _drafter_reads_no_metadata(self, scheduler_output, skip_model_drafters)):
            return original(self, scheduler_output, *args, **kwargs)
        speculative_config = self.speculative_config
        self.speculative_config = None  # vLLM's test for its speculative branch (see the module docstring)
        try:
            prepared = original(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = speculative_config
        _announce("a step without drafts prepared its inputs without spec-decode metadata")
        return prepared

    return _prepare_inputs


def _drafter_reads_no_metadata(runner, scheduler_output, skip_model_drafters: bool) -> bool:
    """The step's drafter does not read its ``SpecDecodeMetadata``: n-gram, or a model drafter skipped."""
    if runner.speculative_config.method in STATELESS_METHODS:
        return True
    return skip_model_drafters and _skips_model_drafter(runner, scheduler_output)


# On the runner: (the step's SchedulerOutput, whether its model drafter pass is skipped), decided once
# per step for both ``_prepare_inputs`` and ``propose_draft_token_ids``.
SKIP_DECISION = "_vspec_drafter_skip"


def _skips_model_drafter(runner, scheduler_output) -> bool:
    """Whether this step's model drafter pass is skipped (sticky K=0; the module docstring)."""
    decided = runner.__dict__.get(SKIP_DECISION)
    if decided is not None and decided[0] is scheduler_output:
        return decided[1]
    skip = (scheduler_output.num_spec_tokens_to_schedule == 0 and _may_skip_drafter(runner)
            and _drafter_skippable(runner, scheduler_output))
    runner.__dict__[SKIP_DECISION] = (scheduler_output, skip)
    return skip


# On the runner: ids of the requests whose drafter cache missed a step (see the module docstring).
STALE = "_vspec_stale_drafter"


def _make_propose(original, skip_model_drafters: bool):
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        stale = _forget_recomputed(self, scheduler_output)
        if scheduler_output.num_spec_tokens_to_schedule == 0:
            if self.speculative_config.method in STATELESS_METHODS:
                return [[] for _ in sampled_token_ids]
            if skip_model_drafters and _skips_model_drafter(self, scheduler_output):
                stale.update(self.input_batch.req_ids)
                # No drafts, as a list (what the n-gram drafter returns): vLLM then copies nothing from
                # the device and hands the scheduler these lists as they are.
                return [[] for _ in self.input_batch.req_ids]
        return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)

    return propose_draft_token_ids


def _drafter_skippable(runner, scheduler_output) -> bool:
    """``control.sticky.skips_drafter`` for this step; says which kind of step, the first time."""
    decode = vllm_adapter.pure_decode(scheduler_output)
    if not skips_drafter(decode, runner.cache_config.enable_prefix_caching):
        return False
    if decode:
        _announce("the model drafter was skipped in a K=0 decode step (sticky K=0)")
    else:
        _announce("the model drafter was skipped in a K=0 step with prompt tokens (prefix caching off)")
    return True


def _may_skip_drafter(runner) -> bool:
    """Skipping is safe only when the model runner takes nothing else from the drafter's pass."""
    if not runner.use_async_scheduling:
        return True
    if _base.first_time(f"{NAME}: async"):
        logger.warning("vspec patch %s: vLLM schedules asynchronously, so the model drafter keeps running in "
                       "K=0 steps (the next step needs its pass); serve with --no-async-scheduling to skip it",
                       NAME)
    return False


def _forget_recomputed(runner, scheduler_output) -> set:
    """The runner's stale set, less requests that finished or were preempted (recomputed from scratch)."""
    stale = runner.__dict__.setdefault(STALE, set())
    if stale:
        stale.difference_update(scheduler_output.finished_req_ids)
        stale.difference_update(scheduler_output.preempted_req_ids or ())
    return stale


def _make_take(original):
    def take_draft_token_ids(self):
        result = original(self)
        stale = self.__dict__.get(STALE)
        if result is not None and stale:
            drafts = result.draft_token_ids
            for index, req_id in enumerate(result.req_ids):
                if req_id in stale and len(drafts[index]):
                    drafts[index] = []  # drafted from a cache the skipped steps left behind
        return result

    return take_draft_token_ids
