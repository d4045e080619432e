"""Patch: ``vllm.config.vllm.VllmConfig._maybe_disable_dynamic_sd_for_data_parallel`` -- per-rank K for dense DP.

Why: vLLM 0.32 drops ``num_speculative_tokens_per_batch_size`` (its per-step K, which vspec's
scheduler rewrites) whenever ``data_parallel_size > 1``: "Dynamic speculative decoding is not
supported with data parallelism because data-parallel ranks can select different
speculative-token counts, causing DP divergence and deadlocks". Every rank then runs the fixed
maximum K and vspec's controllers stay idle. The reason holds for MoE models only: their DP ranks
step in lock-step (``DPEngineCoreProc``, dummy batches on idle ranks) and each drafter forward
all-reduces token counts across ranks (``coordinate_batch_across_dp`` in
vllm.v1.spec_decode.llm_base_proposer), once at K=1 and twice at K>1, with K-1 more forwards of a
model drafter, so ranks with different K would issue different collectives and hang. A dense
model's DP ranks are independent engines (``reconfigure_for_independent_dp_rank`` in
vllm.v1.engine.core sets DP size 1 inside each engine core): no collective spans ranks, and each
rank's K can follow its own batch.

How: the wrapper returns without dropping the table when the target is dense
(``ModelConfig.is_moe`` false, the same test vLLM uses to choose lock-step engines), and calls
vLLM's function otherwise. So MoE ranks keep vLLM's fixed K: they agree on K because none of them
changes it, with no message between ranks; the cost is adaptive K for MoE models under DP. Each
dense rank runs its own AdaptiveScheduler and controller (vspec_runtime/parallel.py reports its
rank in the trace and on /metrics).

Enabled by: adaptive K (``adaptive.enabled``), in the process that builds vLLM's config (the API
server, or the offline engine's front end).

Delete when: vLLM keeps per-step K for dense models under data parallelism, or agrees K across
lock-step ranks itself; tests/test_scale_out.py's DP=2 server then shows per-rank K with
``VSPEC_DISABLE_PATCHES=dp-dynamic-k``.
"""

from __future__ import annotations

import logging
from types import ModuleType

from vspec_runtime.patches import _base, _hooks

logger = logging.getLogger("vspec.patches")

NAME = "dp-dynamic-k"
TARGET_MODULE = "vllm.config.vllm"
SYMBOLS = (
    f"{TARGET_MODULE}:VllmConfig._maybe_disable_dynamic_sd_for_data_parallel",
    "vllm.config.model:ModelConfig.is_moe",
)


def install(spec) -> None:
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType) -> bool:
    _base.check_symbols(NAME, SYMBOLS)
    return _base.patch_attribute(module.VllmConfig, "_maybe_disable_dynamic_sd_for_data_parallel", NAME, _make_keep)


def _make_keep(original):
    def _maybe_disable_dynamic_sd_for_data_parallel(self, *args, **kwargs):
        dense = self.model_config is not None and not self.model_config.is_moe
        if dense and self.parallel_config.data_parallel_size > 1:
            logger.info("vspec patch %s live: dense model, %d independent DP ranks each keep per-step K",
                        NAME, self.parallel_config.data_parallel_size)
            return None
        return original(self, *args, **kwargs)

    return _maybe_disable_dynamic_sd_for_data_parallel
