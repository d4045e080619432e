"""The parallel layout a launch asks vLLM for (tensor, pipeline, data parallel), and what it needs first.

vspec adds no parallelism of its own: TP, PP and DP are vLLM's flags, passed after `--` (or in
``serving.extra_args``). This module reads them back so that `vspec serve` can refuse, in one line
and before anything starts, a layout vLLM would only refuse with a traceback after loading, and so
that `vspec doctor` can say what a preset would run. Pure: reads config files and the CPU list,
launches nothing. What each layout does inside vLLM, and what was measured, is in docs/scaling.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

# vLLM's own spellings (vllm.engine.arg_utils, 0.32): long flag and short alias per size.
SIZE_FLAGS = {
    "--tensor-parallel-size": "tensor", "-tp": "tensor",
    "--pipeline-parallel-size": "pipeline", "-pp": "pipeline",
    "--data-parallel-size": "data", "-dp": "data",
    "--data-parallel-size-local": "data_local", "-dpl": "data_local",
}
EXPERT_PARALLEL_FLAG = "--enable-expert-parallel"
EAGER_FLAG = "--enforce-eager"
CPU_BIND_VARIABLE = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    data_local: Optional[int] = None  # DP ranks on this node; vLLM's default is all of them
    expert: bool = False
    eager: bool = False  # --enforce-eager: vLLM's CPU build cannot run PP > 1 without its compiled warm-up

    @property
    def ranks_per_engine(self) -> int:
        """Worker processes behind one engine core (one DP rank): TP x PP."""
        return self.tensor * self.pipeline

    @property
    def local_ranks(self) -> int:
        """Worker processes this node starts: TP x PP x local DP ranks."""
        return self.ranks_per_engine * (self.data_local or self.data)

    @property
    def single(self) -> bool:
        return self.local_ranks == 1 and self.data == 1

    def describe(self) -> str:
        return f"TP={self.tensor} PP={self.pipeline} DP={self.data}" + (" EP" if self.expert else "")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ranks_per_engine": self.ranks_per_engine, "local_ranks": self.local_ranks}


def parse_layout(vllm_args: Sequence[str]) -> ParallelLayout:
    """The sizes in a `vllm serve` argument list (``--flag N`` or ``--flag=N``; the last one wins, as
    in argparse). A size that is not a positive integer is left to vLLM to reject."""
    sizes: dict[str, Any] = {}
    args = list(vllm_args)
    for index, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        if flag not in SIZE_FLAGS:
            continue
        text = inline if inline else (args[index + 1] if index + 1 < len(args) else "")
        if text.isdigit() and int(text) > 0:
            sizes[SIZE_FLAGS[flag]] = int(text)
    return ParallelLayout(**sizes, expert=EXPERT_PARALLEL_FLAG in args, eager=EAGER_FLAG in args)


def engine_layout(engine_kwargs: dict[str, Any]) -> ParallelLayout:
    """The layout of vllm.LLM keyword arguments (the offline engines of bench, profile and tests)."""
    return ParallelLayout(tensor=int(engine_kwargs.get("tensor_parallel_size") or 1),
                          pipeline=int(engine_kwargs.get("pipeline_parallel_size") or 1),
                          data=int(engine_kwargs.get("data_parallel_size") or 1),
                          eager=bool(engine_kwargs.get("enforce_eager")))


# --- what vLLM would refuse -------------------------------------------------------------------


def model_config(path: Optional[str]) -> Optional[dict[str, Any]]:
    """A local model's config.json, or None (a hub id, or not prepared: vLLM will say)."""
    if not path:
        return None
    config_file = Path(path) / "config.json"
    try:
        return json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _attention_heads(config: dict[str, Any]) -> Optional[int]:
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = text_config.get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def head_problem(layout: ParallelLayout, config: Optional[dict[str, Any]], what: str) -> Optional[str]:
    """vLLM 0.32 (ModelConfig.verify_with_parallel_config) requires TP to divide the attention heads."""
    heads = _attention_heads(config) if config else None
    if heads is None or heads % layout.tensor == 0:
        return None
    sizes = [size for size in range(1, heads + 1) if heads % size == 0]
    return (f"--tensor-parallel-size {layout.tensor} does not divide the {heads} attention heads of the {what}: "
            f"vLLM refuses it; use one of {', '.join(map(str, sizes))}")


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_core_problem(layout: ParallelLayout, cores: int) -> Optional[str]:
    """vLLM's CPU workers each bind OpenMP threads to cores of their own: one core per rank at least."""
    if layout.local_ranks <= cores:
        return None
    return (f"{layout.describe()} starts {layout.local_ranks} CPU worker processes but vLLM may use only "
            f"{cores} core{'s' if cores != 1 else ''} here: each CPU rank needs a core of its own")


def cpu_pipeline_problem(layout: ParallelLayout, method: str) -> Optional[str]:
    """What vLLM 0.32's CPU build cannot run with PP > 1 (it uses the V1 model runner: the V2 runner
    needs Triton). Measured here (docs/scaling.md): speculation fails on the stages without a drafter,
    at KV-cache set-up (AttributeError: 'CPUModelRunner' object has no attribute 'drafter') and, past
    that, in the first steps; --enforce-eager fails the first step of the second stage even without
    speculation (AssertionError in sync_and_gather_intermediate_tensors)."""
    if layout.pipeline == 1:
        return None
    flag = f"--pipeline-parallel-size {layout.pipeline}"
    if method != "none":
        return (f"vLLM 0.32's CPU build cannot run speculative decoding with {flag} (the pipeline stages without "
                "the drafter fail: 'CPUModelRunner' object has no attribute 'drafter'); use tensor parallelism, "
                "or serve PP with --no-speculation")
    if layout.eager:
        return (f"vLLM 0.32's CPU build cannot run {flag} with --enforce-eager (the second stage's first step fails "
                "in sync_and_gather_intermediate_tensors); drop --enforce-eager")
    return None


def layout_problems(layout: ParallelLayout, target_config: Optional[dict[str, Any]],
                    drafter_config: Optional[dict[str, Any]], method: str, on_cpu: bool,
                    cores: Optional[int] = None) -> list[str]:
    """Every reason vLLM would refuse this layout, one line each (empty: nothing known against it).

    A draft model runs at the target's TP size in vLLM 0.32, so its heads must divide too; an EAGLE
    head shares the target's attention shape."""
    problems = [head_problem(layout, target_config, "target model")]
    if method == "draft":
        problems.append(head_problem(layout, drafter_config, "draft model"))
    if on_cpu:
        problems.append(cpu_core_problem(layout, cores if cores is not None else cpu_cores()))
        problems.append(cpu_pipeline_problem(layout, method))
    return [problem for problem in problems if problem]


# --- CPU thread binding -----------------------------------------------------------------------


def numa_nodes() -> int:
    nodes = Path("/sys/devices/system/node")
    found = [entry for entry in nodes.glob("node[0-9]*")] if nodes.exists() else []
    return max(1, len(found))


def cpu_binding(layout: ParallelLayout, cores: Optional[list[int]] = None,
                nodes: Optional[int] = None) -> dict[str, str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a multi-rank layout on a machine with fewer NUMA nodes than ranks.

    vLLM's CPU build binds each local rank to a NUMA node of its own ("auto") and asserts
    "Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers" otherwise, so TP=2 on a
    one-node machine never starts. Split the allowed cores into equal contiguous groups instead, one
    per rank ("0|1" for two ranks on two cores), in vLLM's rank order [DP, PP, TP]. Empty when one
    rank runs, the nodes suffice, or the caller already set the variable."""
    if layout.local_ranks <= 1 or CPU_BIND_VARIABLE in os.environ:
        return {}
    if (nodes if nodes is not None else numa_nodes()) >= layout.local_ranks:
        return {}
    allowed = sorted(cores if cores is not None else os.sched_getaffinity(0))
    share = len(allowed) // layout.local_ranks
    if share == 0:
        return {}  # cpu_core_problem refuses this layout before launch
    groups = [allowed[rank * share:(rank + 1) * share] for rank in range(layout.local_ranks)]
    return {CPU_BIND_VARIABLE: "|".join(",".join(map(str, group)) for group in groups)}


# --- the launch side --------------------------------------------------------------------------


def runs_on_cpu(device: Optional[str]) -> bool:
    """``serving.device = "cpu"``, or vLLM's CPU wheel (the only vLLM here without its `vllm` metadata)."""
    import importlib.util

    from vspec_runtime.vllm_entry import vllm_metadata_present

    return device == "cpu" or (not vllm_metadata_present() and importlib.util.find_spec("vllm") is not None)


def preflight(layout: ParallelLayout, method: str, target_path: str, drafter_path: Optional[str],
              device: Optional[str]) -> None:
    """Raise UserInputError (exit 2) with the first reason vLLM would refuse ``layout``, before launch."""
    if layout.single:
        return
    problems = layout_problems(layout, model_config(target_path), model_config(drafter_path), method,
                               on_cpu=runs_on_cpu(device))
    if problems:
        from vspec_cli._errors import UserInputError

        raise UserInputError(problems[0], hint="docs/scaling.md lists the layouts that run, and how")


# --- what `vspec doctor` says about a layout --------------------------------------------------

FEATURES = ("adaptive K", "per-request lengths", "confidence stop", "relaxed acceptance")
MODEL_DRAFTERS = ("draft", "eagle", "eagle3")
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def is_moe(config: Optional[dict[str, Any]]) -> Optional[bool]:
    """Whether a model's config declares experts; None when the config is not here to read."""
    if config is None:
        return None
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return any(isinstance(text_config.get(key), int) and text_config[key] > 1 for key in _MOE_KEYS)


def k_agreement(layout: ParallelLayout, moe: Optional[bool]) -> str:
    """Whether DP ranks must agree on K, decided before launch. "per-rank": one rank, or a dense
    model's independent DP ranks, each with its own controller (the dp-dynamic-k patch keeps vLLM's
    per-step K on for them). "fixed": an MoE model's DP ranks step in lock-step and vLLM holds K at
    the maximum on every rank. "unknown": DP on a model whose config is not here to read."""
    if layout.data == 1 or moe is False:
        return "per-rank"
    return "fixed" if moe else "unknown"


_TESTED_TP = "tests/test_scale_out.py runs TP=2 with ngram, draft and eagle, greedy output equal to one process"
_TESTED_DP = "tests/test_scale_out.py serves DP=2 (dense, ngram): each rank's controller changes K on its own"


def feature_support(layout: ParallelLayout, method: str, moe: Optional[bool],
                    on_cpu: bool = True) -> dict[str, dict[str, str]]:
    """Per feature: a status and why. ``tested``: a real-vLLM test runs it in this kind of layout;
    ``expected``: the layout does not reach the feature, but no test runs it so; ``off``: K is held
    at the maximum; ``unsupported``: vLLM cannot run the layout with speculation; ``not applicable``:
    the method has no such thing."""
    if layout.single:
        one_process = _status("tested", "one process, as the rest of the test suite runs it")
        support = {feature: dict(one_process) for feature in FEATURES}
    else:
        support = {
            "adaptive K": _status("tested" if layout.data == 1 else "expected",
                                  "one scheduler per engine core (per DP rank) chooses K for its TP/PP workers; "
                                  + (_TESTED_TP if layout.data == 1 else _TESTED_DP)),
            "per-request lengths": _status("tested" if layout.data == 1 else "expected",
                                           "trimmed in the rank's scheduler, before any worker sees the drafts"),
            "confidence stop": _status("expected", "worker-side patches run the same on every rank; no test runs "
                                                   "them in this layout"),
            "relaxed acceptance": _status("expected", "worker-side patches run the same on every rank; no test "
                                                      "runs them in this layout"),
        }
        if layout.data > 1 and layout.ranks_per_engine == 1 and moe is False:
            support["adaptive K"] = _status("tested", _TESTED_DP)
    agreement = k_agreement(layout, moe)
    if agreement != "per-rank":
        why = ("MoE DP ranks step in lock-step and every drafter forward is a collective across ranks: "
               "vLLM holds K at the maximum on every rank")
        held = _status("off", why) if agreement == "fixed" else _status("off if MoE", why + " (the target's "
                                                                               "config is not here to tell)")
        support["adaptive K"] = support["per-request lengths"] = held
    if on_cpu and layout.pipeline > 1 and method != "none":
        support = {feature: _status("unsupported", "vLLM 0.32's CPU build cannot run speculation with PP > 1 "
                                                   "(docs/scaling.md)") for feature in FEATURES}
    if method not in MODEL_DRAFTERS:
        support["confidence stop"] = support["relaxed acceptance"] = _status(
            "not applicable", f"needs a model drafter (draft, eagle, eagle3), not {method}")
    return support


def _status(status: str, why: str) -> dict[str, str]:
    return {"status": status, "why": why}


def layout_report(layout: ParallelLayout, method: str, target_path: Optional[str], drafter_path: Optional[str],
                  device: Optional[str]) -> dict[str, Any]:
    """What `vspec doctor --json` says under "parallel": the layout, what would stop it, K agreement,
    and each feature's support."""
    target, drafter = model_config(target_path), model_config(drafter_path)
    moe, on_cpu = is_moe(target), runs_on_cpu(device)
    problems = [] if layout.single else layout_problems(layout, target, drafter, method, on_cpu)
    return {
        "layout": layout.as_dict(),
        "describe": layout.describe(),
        "moe": moe,
        "problems": problems,
        "k_agreement": k_agreement(layout, moe),
        "features": feature_support(layout, method, moe, on_cpu),
    }
