"""Which ranks one AdaptiveScheduler serves, for the trace, the snapshot and /metrics.

vLLM runs one scheduler per engine core, that is per data-parallel rank; the tensor- and pipeline-
parallel workers of that rank execute what it schedules, so one controller (one K per step) serves
all of them. Data-parallel ranks each have a scheduler and a controller of their own:

* dense models: each DP rank is an independent engine (vLLM's ``reconfigure_for_independent_dp_rank``
  sets DP size 1 inside the engine core; ``data_parallel_index`` keeps the rank). Nothing spans
  ranks, so each controller fits K to its own batch; the dp-dynamic-k patch keeps vLLM's per-step K
  on for them (vspec_runtime/patches/dp_dynamic_k.py).
* MoE models: DP ranks step in lock-step and every drafter forward is a collective across ranks, so
  K must agree; vLLM then drops per-step K and every rank runs the fixed maximum (the scheduler sees
  no ``dynamic_sd_lookup`` and its controller stays idle). Agreement without a message, at the cost
  of adaptive K.

Pure: reads attributes of vLLM's config objects, imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any


def rank_layout(vllm_config: Any) -> dict[str, Any]:
    """The ranks this engine core's scheduler serves."""
    parallel = vllm_config.parallel_config
    return {
        "dp_rank": int(getattr(parallel, "data_parallel_index", 0) or 0),
        # Above 1 only inside an MoE model's lock-step engine cores (dense ranks see 1).
        "dp_lockstep_size": int(getattr(parallel, "data_parallel_size", 1) or 1),
        "tp_size": int(getattr(parallel, "tensor_parallel_size", 1) or 1),
        "pp_size": int(getattr(parallel, "pipeline_parallel_size", 1) or 1),
    }

