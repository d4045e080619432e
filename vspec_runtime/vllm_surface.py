"""Every vLLM symbol vspec relies on, in one list, and how to check one on the installed vLLM.

`vspec doctor` checks each entry (ok or fail, with the reason) and tests/test_vllm_drift.py asserts
them all, so an upstream rename fails a test instead of a server. To rely on something new in vLLM,
append one ``Sym(...)`` line to SURFACE.

A target is ``"module:Qualified.name"`` (the module is imported, the rest is walked with getattr),
or an entry-point group name for kind ``entry-point-group``. ``params`` are the leading parameter
names (after ``self``) in order, for the calls vspec makes or overrides positionally.
``needed_for`` says which features use it: "core" (always), "adaptive", or a method name
(ngram, draft, eagle, eagle3), so `vspec doctor --method M [--adaptive]` can check only those.

This module imports nothing from vLLM at import time; the runtime may call ``problem()`` before
patching to raise a clear incompatibility error.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

KINDS = ("class", "function", "attribute", "field", "entry-point-group")
METHODS = ("ngram", "draft", "eagle", "eagle3", "none")
FEATURES = ("core", "adaptive", *METHODS)

CORE = ("core",)
ADAPTIVE = ("adaptive",)
EAGLE = ("eagle", "eagle3")
DRAFTERS = ("draft", "eagle", "eagle3")  # methods with a model drafter (confidence stop, relaxed acceptance)
SPECULATING = ("ngram", "draft", "eagle", "eagle3")  # every speculative method (verification, sampling)


@dataclass(frozen=True)
class Sym:
    target: str
    kind: str
    why: str
    params: Optional[tuple[str, ...]] = None
    needed_for: tuple[str, ...] = CORE

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.target}: kind {self.kind!r} is not one of {KINDS}")
        unknown = set(self.needed_for) - set(FEATURES)
        if unknown:
            raise ValueError(f"{self.target}: unknown features {sorted(unknown)}")
        if self.kind != "entry-point-group" and ":" not in self.target:
            raise ValueError(f"{self.target}: expected 'module:Qualified.name'")

    @property
    def name(self) -> str:
        """The dotted name people read: ``vllm.config.speculative.SpeculativeConfig.num_spe...``."""
        return self.target.replace(":", ".")

    def matters_for(self, method: Optional[str], adaptive: bool) -> bool:
        """Whether `vspec doctor --method M [--adaptive]` checks this symbol (no flags: all)."""
        if method is None and not adaptive:
            return True
        wanted = {"core"} | ({method} if method else set()) | ({"adaptive"} if adaptive else set())
        return bool(wanted & set(self.needed_for))


_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
_OUT = "vllm.v1.core.sched.output:SchedulerOutput"
_PAR = "vllm.config.parallel:ParallelConfig"

SURFACE: tuple[Sym, ...] = (
    Sym(_SCHED, "class", "AdaptiveScheduler subclasses it and is passed as --scheduler-cls", ("vllm_config", "kv_cache_config", "structured_output_manager", "block_size"), ADAPTIVE),
    Sym("vllm.v1.core.sched.async_scheduler:AsyncScheduler", "class", "AsyncAdaptiveScheduler subclasses it: what AdaptiveScheduler builds when vLLM schedules asynchronously", None, ADAPTIVE),
    Sym("vllm.config.vllm:VllmConfig.scheduler_config", "field", "AdaptiveScheduler reads the resolved scheduler config to pick its base class", None, ADAPTIVE),
    Sym("vllm.config.scheduler:SchedulerConfig.async_scheduling", "field", "resolved by vLLM and the platform: AdaptiveScheduler picks the async base class when it is on", None, ADAPTIVE),
    Sym(f"{_SCHED}.add_request", "function", "overridden: under async scheduling a client's draft cap has no effect, said once", ("request",), ADAPTIVE),
    Sym(f"{_SCHED}.schedule", "function", "overridden: K is chosen just before vLLM schedules a step", (), ADAPTIVE),
    Sym(f"{_SCHED}.update_from_output", "function", "overridden: accepted counts and step timing feed the policy", ("scheduler_output", "model_runner_output"), ADAPTIVE),
    Sym(f"{_SCHED}.update_draft_token_ids", "function", "per-request draft trimming (confidence stop counts, per-request lengths, caps); vLLM calls it only under synchronous scheduling", ("draft_token_ids",), ADAPTIVE),
    Sym(f"{_SCHED}.shutdown", "function", "overridden: the controller writes its summary when the engine stops", (), ADAPTIVE),
    Sym(f"{_SCHED}.dynamic_sd_lookup", "attribute", "the batch-size -> K list vspec rewrites before each step", None, ADAPTIVE),
    Sym(f"{_SCHED}.num_spec_tokens", "attribute", "the start-up K, the ceiling of every K vspec picks", None, ADAPTIVE),
    Sym(f"{_SCHED}.max_num_scheduled_tokens", "attribute", "token budget: K is feasible when B*(K+1) fits; the budget the batch estimate replays", None, ADAPTIVE),
    Sym(f"{_SCHED}.vllm_config", "attribute", "its parallel_config says which ranks the controller serves (vspec_runtime/parallel.py)", None, ADAPTIVE),
    Sym("vllm.config.vllm:VllmConfig._maybe_disable_dynamic_sd_for_data_parallel", "function", "wrapped (dp-dynamic-k): keeps per-step K for dense models under DP", None, ADAPTIVE),
    Sym("vllm.config.model:ModelConfig.is_moe", "attribute", "MoE DP ranks step in lock-step: they keep vLLM's fixed K", None, ADAPTIVE),
    Sym(f"{_PAR}.data_parallel_index", "field", "this engine core's DP rank (DP size is 1 inside a dense model's engine)", None, ADAPTIVE),
    Sym(f"{_PAR}.data_parallel_size", "field", "above 1 inside an engine core: MoE ranks in lock-step, K must agree", None, ADAPTIVE),
    Sym(f"{_PAR}.tensor_parallel_size", "field", "TP workers behind the scheduler, reported in trace and /metrics", None, ADAPTIVE),
    Sym(f"{_PAR}.pipeline_parallel_size", "field", "PP workers behind the scheduler, reported in trace and /metrics", None, ADAPTIVE),
    Sym(f"{_OUT}.num_spec_tokens_to_schedule", "field", "the per-step K the model runner passes to every drafter", None, ADAPTIVE),
    Sym("vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size", "field", "turns on vLLM's dynamic SD plumbing (`vspec serve` sets it)", None, ADAPTIVE),
    Sym("vllm.config.scheduler:SchedulerConfig.scheduler_cls", "field", "how AdaptiveScheduler is plugged in (--scheduler-cls)", None, ADAPTIVE),
    # --- what the adaptive scheduler reads each step (vspec_runtime/scheduler.py, vspec_runtime/vllm_adapter.py) ---
    Sym(f"{_SCHED}.running", "attribute", "the batch estimate K is chosen for, and whether the engine went idle", None, ADAPTIVE),
    Sym(f"{_SCHED}.waiting", "attribute", "the batch estimate K is chosen for, and whether the engine went idle", None, ADAPTIVE),
    Sym(f"{_SCHED}.requests", "attribute", "context tokens per step and which requests a confidence cut counts for", None, ADAPTIVE),
    Sym(f"{_SCHED}.max_num_active_reqs", "attribute", "running slots: how many waiting requests the batch estimate admits", None, ADAPTIVE),
    Sym(f"{_SCHED}.kv_cache_manager", "attribute", "the batch estimate admits waiting requests only while KV blocks are free", None, ADAPTIVE),
    Sym(f"{_SCHED}.block_size", "attribute", "KV blocks a waiting request needs (the batch estimate)", None, ADAPTIVE),
    Sym("vllm.v1.core.kv_cache_manager:KVCacheManager.block_pool", "attribute", "where the batch estimate reads the free KV blocks", None, ADAPTIVE),
    Sym("vllm.v1.core.block_pool:BlockPool.get_num_free_blocks", "function", "free KV blocks (the batch estimate)", (), ADAPTIVE),
    Sym("vllm.v1.request:Request.num_tokens", "attribute", "prompt tokens a waiting request still needs (the batch estimate)", None, ADAPTIVE),
    Sym("vllm.v1.request:Request.num_tokens_with_spec", "attribute", "tokens a running request needs this step (the batch estimate)", None, ADAPTIVE),
    Sym("vllm.v1.request:Request.num_output_placeholders", "attribute", "tokens still in flight for a running request (the batch estimate)", None, ADAPTIVE),
    Sym(f"{_OUT}.scheduled_spec_decode_tokens", "field", "the drafts each request had verified in the step", None, ADAPTIVE),
    Sym(f"{_OUT}.num_invalid_spec_tokens", "field", "drafts vLLM dropped before verification, not counted as drafted", None, ADAPTIVE),
    Sym(f"{_OUT}.num_scheduled_tokens", "field", "batch size, and whether the step was pure decode", None, ADAPTIVE),
    Sym(f"{_OUT}.total_num_scheduled_tokens", "field", "tokens in the step's forward (step cost for the latency model)", None, ADAPTIVE),
    Sym(f"{_OUT}.scheduled_new_reqs", "field", "a step that admits requests is not pure decode", None, ADAPTIVE),
    Sym(f"{_OUT}.preempted_req_ids", "field", "a step that preempts requests is not pure decode", None, ADAPTIVE),
    Sym("vllm.v1.outputs:ModelRunnerOutput.sampled_token_ids", "field", "accepted drafts per request = tokens sampled - 1", None, ADAPTIVE),
    Sym("vllm.v1.outputs:ModelRunnerOutput.req_id_to_index", "field", "finds each request's sampled tokens", None, ADAPTIVE),
    Sym("vllm.v1.outputs:DraftTokenIds.req_ids", "field", "pairs each draft list with its request (confidence cuts)", None, ADAPTIVE),
    Sym("vllm.v1.request:Request.is_finished", "function", "finished requests are not counted as confidence cuts", (), ADAPTIVE),
    Sym("vllm.v1.request:Request.num_computed_tokens", "attribute", "context tokens per step (samples file, profile policy); what a request still needs (the batch estimate)", None, ADAPTIVE),
    Sym("vllm.v1.request:Request.sampling_params", "attribute", "per-request draft caps (vllm_xargs vspec_max_draft)", None, ADAPTIVE),
    Sym("vllm.sampling_params:SamplingParams.extra_args", "field", "where vLLM keeps a request's vllm_xargs (the vspec_max_draft cap)", None, ADAPTIVE),
    Sym("vllm.v1.spec_decode.dynamic.utils:build_dynamic_sd_schedule_lookup", "function", "builds the dense K lookup vspec overwrites", ("num_speculative_tokens_per_batch_size", "vllm_max_batch_size", "vllm_num_speculative_tokens"), ADAPTIVE),
    Sym("vllm.model_executor.models:ModelRegistry.register_model", "function", "registers vspec's EAGLE head architectures", ("model_arch", "model_cls"), EAGLE),
    Sym("vllm.plugins:load_general_plugins", "function", "vLLM calls vspec's register() through it in every process", (), CORE),
    Sym("vllm.plugins:load_plugins_by_group", "function", "`vspec doctor` uses it to confirm vLLM loads the plugin", ("group",), CORE),
    Sym("vllm.general_plugins", "entry-point-group", "the entry-point group vspec_runtime.plugin:register is published under", None, CORE),
    # --- sampled requests under speculation on CPU (vspec_runtime/patches/cpu_expand_kernel.py) ---
    Sym("vllm.utils.cpu_triton_utils:_expand_kernel_impl", "function", "patched: vLLM's CPU expand kernel leaves float outputs (temperature, top-p per draft position) unwritten", ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to"), SPECULATING),
    Sym("vllm.triton_utils.dispatcher:register_kernels", "function", "re-registers the fixed CPU expand kernel when the platform registered vLLM's first", ("overrides",), SPECULATING),
    Sym("vllm.v1.sample.rejection_sampler:expand_batch_to_tokens", "function", "the caller of the expand kernel whose float outputs the CPU patch fixes", ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to"), SPECULATING),
    # --- Qwen2 EAGLE-1 heads (vspec_runtime/models/qwen2_eagle.py, registered by vspec_runtime/models) ---
    Sym("vllm.model_executor.models:ModelRegistry.get_supported_archs", "function", "Qwen2 EAGLE architectures are registered only where vLLM lacks them", (), ("eagle",)),
    Sym("vllm.transformers_utils.configs.eagle:EAGLEConfig", "class", "renames a head's architecture X to EagleX under method=eagle: the aliases vspec registers", ("model", "truncated_vocab_size", "method"), ("eagle",)),
    Sym("vllm.model_executor.models.qwen2:Qwen2ForCausalLM", "class", "the Qwen2 EAGLE head subclasses it for its interfaces and compute_logits", ("vllm_config", "prefix"), ("eagle",)),
    Sym("vllm.model_executor.models.qwen2:Qwen2DecoderLayer", "class", "the Qwen2 EAGLE head's layers (q/k/v biases)", ("config", "cache_config", "quant_config", "prefix"), ("eagle",)),
    Sym("vllm.model_executor.models.qwen2:Qwen2DecoderLayer.input_layernorm", "attribute", "removed on the first EAGLE-1 layer", None, ("eagle",)),
    Sym("vllm.model_executor.models.qwen2:Qwen2Attention.qkv_proj", "attribute", "its bias is zero-filled when a Qwen2 EAGLE head has none", None, ("eagle",)),
    Sym("vllm.model_executor.models.qwen2:Qwen2Model.hf_to_vllm_mapper", "attribute", "q/k/v and gate/up checkpoint names -> vLLM's fused layers", None, ("eagle",)),
    Sym("vllm.model_executor.models.utils:AutoWeightsLoader", "class", "loads the Qwen2 EAGLE head's weights", ("module",), ("eagle",)),
    Sym("vllm.model_executor.models.utils:process_eagle_weight", "function", "marks a head with its own embed_tokens so the proposer shares the rest", ("model", "name"), ("eagle",)),
    Sym("vllm.model_executor.models.utils:get_draft_quant_config", "function", "the Qwen2 EAGLE head uses the drafter's quantization config", ("vllm_config",), ("eagle",)),
    Sym("vllm.model_executor.layers.linear:ReplicatedLinear", "class", "the EAGLE fc over cat[embed, hidden]", ("input_size", "output_size", "bias"), ("eagle",)),
    Sym("vllm.compilation.decorators:support_torch_compile", "function", "the Qwen2 EAGLE head compiles like vLLM's Llama one", None, ("eagle",)),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_lm_head", "function", "a Qwen2 EAGLE head predicts through the target's LM head", ("target_language_model",), ("eagle",)),
    # --- EAGLE-3 heads with a reduced draft vocabulary (vLLM's own classes; tests/test_eagle3_reduced_vocab.py) ---
    Sym("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM", "class", "serves a Llama EAGLE-3 head in the trainer's layout (fc over 3 aux states, own lm_head over draft_vocab_size ids)", ("vllm_config", "prefix"), ("eagle3",)),
    Sym("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.compute_logits", "function", "scatters the head's N draft logits to target ids through d2t (-inf elsewhere): drafts are target ids", ("hidden_states",), ("eagle3",)),
    Sym("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.draft_id_to_target_id", "attribute", "where a reduced-vocabulary head's d2t is loaded (absent when draft_vocab_size equals the target's)", None, ("eagle3",)),
    Sym("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.combine_hidden_states", "function", "fc over cat[aux hidden states] at the first draft step", ("hidden_states",), ("eagle3",)),
    Sym("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.load_weights", "function", "renames d2t to draft_id_to_target_id, skips t2d, keeps the target's embed_tokens when the head has none", ("weights",), ("eagle3",)),
    Sym("vllm.model_executor.models.llama_eagle3:LlamaDecoderLayer.hidden_norm", "attribute", "the head's norm on the fc output (layers.0.hidden_norm.weight in the trainer's layout)", None, ("eagle3",)),
    Sym("vllm.model_executor.models.llama:LlamaForCausalLM.set_aux_hidden_state_layers", "function", "SupportsEagle3 on the Llama target: which layers' residual streams it returns (sorted, de-duplicated)", ("layers",), ("eagle3",)),
    Sym("vllm.model_executor.models.llama:LlamaForCausalLM.get_eagle3_default_aux_hidden_state_layers", "function", "(2, L//2, L-3) when the head's config names no aux layers", (), ("eagle3",)),
    Sym("vllm.model_executor.models.interfaces:supports_eagle3", "function", "the model runner refuses eagle3 on a target without the interface", ("model",), ("eagle3",)),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_eagle3_aux_layers_from_config", "function", "reads eagle_config.eagle_aux_hidden_state_layer_ids from the head's config", (), ("eagle3",)),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", "function", "the CPU model runner calls it after loading: aux hidden states work on CPU", (), ("eagle3",)),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.eagle3_use_aux_hidden_state", "attribute", "eagle_config.use_aux_hidden_state: the proposer combines aux states through fc", None, ("eagle3",)),
    # --- confidence stop (vspec_runtime/patches/llm_base_proposer.py, patches/gpu_model_runner.py) ---
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose", "function", "patched (confidence stop): per-request keep lengths from the drafts' entropies", ("num_speculative_tokens",), DRAFTERS),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._greedy_sample", "function", "patched (confidence stop): same argmax, plus the top-k entropy of the logits", ("hidden_states",), DRAFTERS),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.use_local_argmax_reduction", "attribute", "confidence stop records no entropy in this mode", None, DRAFTERS),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.use_heterogeneous_vocab", "attribute", "confidence stop records no entropy in this mode", None, DRAFTERS),
    Sym("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.vllm_config", "attribute", "confidence stop warns when async scheduling makes it inert", None, DRAFTERS),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids", "function", "patched (confidence stop: trims each request's drafts before the scheduler; K=0 fast path: drops drafts from a skipped drafter's cache)", (), (*ADAPTIVE, *DRAFTERS)),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.drafter", "attribute", "where the confidence-stop keep lengths wait for take_draft_token_ids", None, DRAFTERS),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner._draft_token_ids", "attribute", "the drafts a confidence cut belongs to", None, DRAFTERS),
    Sym("vllm.v1.outputs:DraftTokenIds.draft_token_ids", "field", "the per-request draft lists confidence stop trims (and the scheduler counts)", None, (*ADAPTIVE, *DRAFTERS)),
    Sym("vllm.v1.request:Request.is_prefill_chunk", "attribute", "the scheduler counts confidence cuts only for decoding requests", None, ADAPTIVE),
    # --- relaxed acceptance (vspec_runtime/patches/rejection_sampler.py, patches/gpu_model_runner.py) ---
    Sym("vllm.v1.sample.rejection_sampler:rejection_sample", "function", "patched (relaxed acceptance): accepts near-miss greedy drafts", ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs", "target_logits", "bonus_token_ids", "sampling_metadata"), DRAFTERS),
    Sym("vllm.v1.sample.metadata:SamplingMetadata.all_greedy", "field", "relaxed acceptance: greedy rows only", None, DRAFTERS),
    Sym("vllm.v1.sample.metadata:SamplingMetadata.all_random", "field", "relaxed acceptance: nothing to relax when every request samples", None, DRAFTERS),
    Sym("vllm.v1.sample.metadata:SamplingMetadata.temperature", "field", "relaxed acceptance: temperature 0 marks a greedy request", None, DRAFTERS),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample", "function", "patched (relaxed acceptance: publishes tokens generated per request; K=0 fast path: the plain sampler when no request has drafts)", ("logits", "spec_decode_metadata"), (*ADAPTIVE, *DRAFTERS)),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.input_batch", "attribute", "relaxed acceptance reads per-request token counts from it; the K=0 fast path its request ids", None, (*ADAPTIVE, *DRAFTERS)),
    Sym("vllm.v1.worker.gpu_input_batch:InputBatch.num_reqs", "attribute", "requests in the batch (relaxed acceptance gate)", None, DRAFTERS),
    Sym("vllm.v1.worker.gpu_input_batch:InputBatch.num_tokens_no_spec", "attribute", "prompt + generated tokens per request (relaxed acceptance gate)", None, DRAFTERS),
    Sym("vllm.v1.worker.gpu_input_batch:InputBatch.num_prompt_tokens", "attribute", "prompt tokens per request (relaxed acceptance gate)", None, DRAFTERS),
    # --- K=0 fast path (vspec_runtime/patches/k0_fast_path.py) ---
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids", "function", "patched (K=0 fast path): the n-gram drafter is not asked for K=0 drafts", ("scheduler_output", "sampled_token_ids"), ADAPTIVE),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.speculative_config", "attribute", "the K=0 fast path skips only stateless (n-gram) drafters", None, ADAPTIVE),
    Sym("vllm.v1.spec_decode.metadata:SpecDecodeMetadata.num_draft_tokens", "field", "a step with no drafts at all takes the plain sampler", None, ADAPTIVE),
    Sym("vllm.config.speculative:SpeculativeConfig.method", "field", "which drafter the K=0 fast path may skip", None, ADAPTIVE),
    Sym("vllm.v1.worker.gpu_input_batch:InputBatch.req_ids", "attribute", "the requests whose drafter cache a skipped K=0 step leaves behind", None, ADAPTIVE),
    Sym("vllm.v1.core.sched.output:SchedulerOutput.finished_req_ids", "field", "finished requests leave the K=0 fast path's stale set and the per-request acceptance table", None, ADAPTIVE),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs", "function", "patched (K=0 fast path): a step without drafts is prepared without spec-decode metadata", ("scheduler_output",), ADAPTIVE),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.model_config", "attribute", "the K=0 fast path keeps vLLM's input preparation for models with recurrent state", None, ADAPTIVE),
    Sym("vllm.config.model:ModelConfig.has_inner_state", "attribute", "recurrent-state models (Mamba, GDN) read the per-request draft counts of vLLM's speculative input preparation", None, ADAPTIVE),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.cache_config", "attribute", "whether prefix caching is on: without it the K=0 fast path skips a model drafter in prompt steps too", None, ADAPTIVE),
    Sym("vllm.config.cache:CacheConfig.enable_prefix_caching", "field", "prompt blocks a K=0 step leaves without drafter values must not be reused (K=0 fast path; the scheduler mirrors it)", None, ADAPTIVE),
    Sym(f"{_SCHED}.cache_config", "attribute", "whether prefix caching is on: the controller's record of which requests can still draft", None, ADAPTIVE),
    Sym("vllm.v1.worker.gpu_model_runner:GPUModelRunner.use_async_scheduling", "attribute", "the K=0 fast path never skips a model drafter under async scheduling (the next step needs its pass)", None, ADAPTIVE),
    # --- no draft hand-over after a K=0 step (vspec_runtime/patches/k0_draft_handover.py) ---
    Sym("vllm.v1.engine.core:EngineCore.post_step", "function", "patched (K=0 draft hand-over): after a step that drafted nothing the engine core does not fetch drafts from the worker", ("model_executed",), ADAPTIVE),
    Sym("vllm.v1.engine.core:EngineCore.scheduler", "attribute", "the K=0 draft hand-over asks vspec's scheduler whether the step just run drafted", None, ADAPTIVE),
    # --- n-gram kernels compiled at start-up (vspec_runtime/patches/ngram_jit_warmup.py) ---
    Sym("vllm.v1.spec_decode.ngram_proposer:NgramProposer", "class", "its __init__ is patched (n-gram JIT warm-up): one real proposal after vLLM's own warm-up, which compiles nothing", ("vllm_config",), ("ngram",)),
    Sym("vllm.v1.spec_decode.ngram_proposer:NgramProposer.propose", "function", "the n-gram JIT warm-up proposes once on a one-row context", ("num_speculative_tokens", "sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu"), ("ngram",)),
    Sym("vllm.v1.spec_decode.ngram_proposer:NgramProposer.valid_ngram_num_drafts", "attribute", "the n-gram JIT warm-up leaves the proposer's draft counts at zero", None, ("ngram",)),
    Sym("vllm.v1.spec_decode.ngram_proposer:batch_propose_numba", "function", "the numba kernel the n-gram JIT warm-up compiles (through propose)", None, ("ngram",)),
    # --- offline engine runs for `vspec bench` and `vspec profile` (vspec_cli/offline_run.py) ---
    Sym("vllm.entrypoints.llm:LLM.get_metrics", "function", "the bench reads vLLM's counters from it after each phase", (), CORE),
    Sym("vllm.v1.metrics.reader:Metric.name", "field", "the bench picks its counters by metric name", None, CORE),
    Sym("vllm.v1.metrics.reader:Counter.value", "field", "a counter's value (generated tokens, drafts, accepted drafts)", None, CORE),
    Sym("vllm.v1.metrics.reader:Vector.values", "field", "accepted drafts per position (vllm:spec_decode_num_accepted_tokens_per_pos)", None, SPECULATING),
    Sym("vllm.v1.metrics.loggers:PrometheusStatLogger.counter_prompt_tokens", "attribute", "publishes vllm:prompt_tokens, which the bench reads", None, CORE),
    Sym("vllm.v1.metrics.loggers:PrometheusStatLogger.counter_generation_tokens", "attribute", "publishes vllm:generation_tokens, which the bench reads", None, CORE),
    Sym("vllm.v1.spec_decode.metrics:SpecDecodingProm.counter_spec_decode_num_drafts", "attribute", "publishes vllm:spec_decode_num_drafts, which the bench reads", None, SPECULATING),
    Sym("vllm.v1.spec_decode.metrics:SpecDecodingProm.counter_spec_decode_num_draft_tokens", "attribute", "publishes vllm:spec_decode_num_draft_tokens, which the bench reads", None, SPECULATING),
    Sym("vllm.v1.spec_decode.metrics:SpecDecodingProm.counter_spec_decode_num_accepted_tokens", "attribute", "publishes vllm:spec_decode_num_accepted_tokens, which the bench reads", None, SPECULATING),
    Sym("vllm.v1.spec_decode.metrics:SpecDecodingProm.counter_spec_decode_num_accepted_tokens_per_pos", "attribute", "publishes vllm:spec_decode_num_accepted_tokens_per_pos, which the bench reads", None, SPECULATING),
    Sym("vllm.outputs:RequestOutput.outputs", "attribute", "the bench takes each prompt's first completion", None, CORE),
    Sym("vllm.outputs:CompletionOutput.text", "field", "generated text, recorded by the bench", None, CORE),
    Sym("vllm.outputs:CompletionOutput.token_ids", "field", "generated tokens: the bench's output count and the lossless comparisons", None, CORE),
    Sym("vllm.outputs:CompletionOutput.logprobs", "field", "per-token target logprobs, the bench's quality measure", None, CORE),
    Sym("vllm.logprobs:Logprob.logprob", "field", "the log-probability of one generated token", None, CORE),
    # --- the CPU wheel's CLI (vspec_runtime/vllm_entry.py, shim `vllm-version-lookup`) ---
    Sym("vllm.entrypoints.cli.main:main", "function", "`python -m vspec_runtime.vllm_entry` runs vLLM's own CLI through it", (), CORE),
)


def selected(method: Optional[str] = None, adaptive: bool = False,
             surface: tuple[Sym, ...] = SURFACE) -> list[Sym]:
    return [sym for sym in surface if sym.matters_for(method, adaptive)]


# --- checking one symbol -----------------------------------------------------------------------

ImportModule = Callable[[str], Any]


def problem(sym: Sym, import_module: ImportModule = importlib.import_module) -> Optional[str]:
    """None when ``sym`` exists on the importable vLLM as described, else a one-line reason."""
    if sym.kind == "entry-point-group":
        return _group_problem(sym.target, import_module)
    module_name, _, qualname = sym.target.partition(":")
    try:
        obj: Any = import_module(module_name)
    except ImportError as exc:
        return f"cannot import {module_name} ({exc})"
    parts = qualname.split(".")
    owner: Any = None
    for index, part in enumerate(parts):
        owner, last = obj, index == len(parts) - 1
        if last and sym.kind in ("attribute", "field"):
            return _member_problem(sym, owner, part)
        if not hasattr(obj, part):
            where = ".".join([module_name, *parts[:index]])
            return f"{where} has no attribute '{part}'"
        obj = getattr(obj, part)
    if sym.kind == "class" and not inspect.isclass(obj):
        return f"{sym.name} is a {type(obj).__name__}, not a class"
    if sym.kind == "function" and not callable(obj):
        return f"{sym.name} is not callable"
    if sym.params is not None:
        return _params_problem(sym, obj.__init__ if sym.kind == "class" else obj)
    return None


def _member_problem(sym: Sym, owner: Any, member: str) -> Optional[str]:
    cls = owner if inspect.isclass(owner) else type(owner)
    if sym.kind == "field":
        if dataclasses.is_dataclass(cls) and member in {f.name for f in dataclasses.fields(cls)}:
            return None
        if member in getattr(cls, "model_fields", {}):  # a pydantic model
            return None
        if member in getattr(cls, "__struct_fields__", ()):  # a msgspec Struct (SamplingParams)
            return None
        return f"{cls.__module__}.{cls.__qualname__} has no field '{member}'"
    # An instance attribute exists only once __init__ ran: look for the assignment in the source.
    if hasattr(cls, member):
        return None
    assignment = re.compile(rf"\bself\.{re.escape(member)}\s*(:[^=\n]+)?=(?!=)")
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            continue
        if assignment.search(source):
            return None
    return f"{cls.__module__}.{cls.__qualname__} no longer sets self.{member} in __init__"


def _params_problem(sym: Sym, func: Any) -> Optional[str]:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        return f"cannot read the signature of {sym.name} ({exc})"
    names = [p.name for p in signature.parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    expected = list(sym.params or ())
    if names[: len(expected)] != expected:
        return f"{sym.name} takes ({', '.join(names)}), expected ({', '.join(expected)}, ...)"
    return None


def _group_problem(group: str, import_module: ImportModule) -> Optional[str]:
    try:
        plugins = import_module("vllm.plugins")
    except ImportError as exc:
        return f"cannot import vllm.plugins ({exc})"
    groups = {value for value in vars(plugins).values() if isinstance(value, str)}
    if group not in groups:
        return f"vllm.plugins no longer names the entry-point group '{group}'"
    return None
