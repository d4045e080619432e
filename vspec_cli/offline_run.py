"""One offline engine run in its own process: a RuntimeSpec, prompts in, tokens and counters out.

Used by `vspec bench` (one fresh engine per policy, so controller state cannot leak between
policies), `vspec profile collect` and the integration tests. Run as::

    python -m vspec_cli.offline_run [--progress] REQUEST.json RESULT.json

REQUEST: {"spec": {...RuntimeSpec...}, "target_path": str, "drafter_path": str|null,
          "phases": [{"name": str, "prompts": [str, ...], "max_tokens": int, "ignore_eos": bool}],
          "warmup": bool, "chat": bool, "engine_overrides": {...vllm.LLM kwargs...}}
RESULT:  {"phases": [{"name", "outputs": [{"text", "token_ids"}], "elapsed_s", "started_at", "ended_at",
                      "output_tokens", "counters": {...}, "selections": {"K": steps}}],
          "counters": {"vllm:spec_decode_num_drafts": ..., ...}, "controller": {...}|null,
          "trace": [...]|null, "engine_ready_s": float}
Phases run one after another in the same engine (the `mixed` workload changes batch size and text
between phases); each phase submits all its prompts at once, so batch = number of prompts.

Per phase: vLLM's spec-decode counters, the controller's K selections (from its snapshot, which the
scheduler publishes before the last output of a batch is returned) and ``time.perf_counter`` stamps.
That clock is CLOCK_MONOTONIC, the one the controller's trace uses in the engine-core process, so
trace lines can be placed in phases. With ``--progress``, progress goes to stdout as lines
``@@vspec-bench {"stage": ..., "phase": i, "phases": n, "name": ...}`` (what `vspec bench` shows).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

COUNTER_NAMES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
)
PROGRESS_MARK = "@@vspec-bench "

Progress = Callable[..., None]


def print_progress(**fields: Any) -> None:
    print(PROGRESS_MARK + json.dumps(fields), flush=True)


def _no_progress(**fields: Any) -> None:
    pass


def _counters(llm) -> dict[str, Any]:
    found: dict[str, Any] = {name: 0.0 for name in COUNTER_NAMES}
    per_position: list[float] = []
    for metric in llm.get_metrics():
        if metric.name in found and hasattr(metric, "value"):
            found[metric.name] += float(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos" and hasattr(metric, "values"):
            per_position = [float(v) for v in metric.values]
    found["accepted_per_position"] = per_position
    return found


def _counter_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {name: after[name] - before[name] for name in COUNTER_NAMES}
    old = before["accepted_per_position"]
    delta["accepted_per_position"] = [v - (old[i] if i < len(old) else 0.0)
                                      for i, v in enumerate(after["accepted_per_position"])]
    return delta


def _snapshot(run_dir: str) -> Optional[dict[str, Any]]:
    try:
        return json.loads((Path(run_dir) / "controller.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _selections(run_dir: str) -> Counter:
    snapshot = _snapshot(run_dir) or {}
    return Counter({int(k): int(v) for k, v in snapshot.get("selections", {}).items()})


def _render(tokenizer, prompt: str, chat: bool) -> str:
    if not chat or not getattr(tokenizer, "chat_template", None):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def run(request: dict[str, Any], progress: Progress = _no_progress) -> dict[str, Any]:
    from vspec_runtime.spec import RuntimeSpec

    spec = RuntimeSpec.model_validate(request["spec"])
    run_dir = tempfile.mkdtemp(prefix="vspec-offline-")
    os.environ["VSPEC_SPEC"] = spec.to_json()
    os.environ["VSPEC_RUN_DIR"] = run_dir
    if spec.serving.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    from vllm import LLM, SamplingParams

    from vspec_cli.launch import vllm_engine_kwargs

    progress(stage="starting engine")
    started = time.perf_counter()
    kwargs = vllm_engine_kwargs(spec, request["target_path"], request.get("drafter_path"))
    kwargs.update(request.get("engine_overrides", {}))  # e.g. enforce_eager for fast test starts
    llm = LLM(**kwargs, disable_log_stats=False, seed=0, enable_prefix_caching=False)
    tokenizer = llm.get_tokenizer()
    chat = bool(request.get("chat", True))
    if request.get("warmup", True):
        llm.generate([_render(tokenizer, "Hello", chat)], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    engine_ready_s = time.perf_counter() - started

    first_counters = counters = _counters(llm)
    selections = _selections(run_dir)
    phases = []
    total = len(request["phases"])
    for index, phase in enumerate(request["phases"]):
        progress(stage="phase", phase=index, phases=total, name=phase.get("name", ""))
        prompts = [_render(tokenizer, p, chat) for p in phase["prompts"]]
        params = SamplingParams(temperature=0, max_tokens=int(phase["max_tokens"]),
                                ignore_eos=bool(phase.get("ignore_eos", False)))
        phase_start = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        phase_end = time.perf_counter()
        after, after_selections = _counters(llm), _selections(run_dir)
        outputs = [{"text": r.outputs[0].text, "token_ids": list(r.outputs[0].token_ids)} for r in results]
        phases.append({
            "name": phase.get("name", f"phase{index}"),
            "outputs": outputs,
            "elapsed_s": phase_end - phase_start,
            "started_at": phase_start,
            "ended_at": phase_end,
            "output_tokens": sum(len(o["token_ids"]) for o in outputs),
            "counters": _counter_delta(after, counters),
            "selections": {str(k): v for k, v in sorted((after_selections - selections).items())},
        })
        counters, selections = after, after_selections
    progress(stage="done", phases=total)
    time.sleep(0.3)  # let the engine publish its last snapshot (rate-limited to 4/s)
    trace = None
    if spec.adaptive.trace and Path(spec.adaptive.trace).exists():
        trace = [json.loads(line) for line in Path(spec.adaptive.trace).read_text().splitlines() if line.strip()]
    return {"phases": phases, "counters": _counter_delta(counters, first_counters), "controller": _snapshot(run_dir),
            "trace": trace, "engine_ready_s": engine_ready_s}


def main(argv: list[str]) -> int:
    args = argv[1:]
    progress = _no_progress
    if args and args[0] == "--progress":
        progress, args = print_progress, args[1:]
    request_path, result_path = args
    result = run(json.loads(Path(request_path).read_text()), progress)
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
