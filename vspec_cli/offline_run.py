"""One offline engine run in its own process: a RuntimeSpec, prompts in, tokens and counters out.

Used by `vspec bench` (one fresh engine per policy, so controller state cannot leak between
policies) and by the integration tests. Run as::

    python -m vspec_cli.offline_run REQUEST.json RESULT.json

REQUEST: {"spec": {...RuntimeSpec...}, "target_path": str, "drafter_path": str|null,
          "phases": [{"name": str, "prompts": [str, ...], "max_tokens": int}], "warmup": bool,
          "chat": bool, "engine_overrides": {...vllm.LLM kwargs...}}
RESULT:  {"phases": [{"name", "outputs": [{"text", "token_ids"}], "elapsed_s", "output_tokens"}],
          "counters": {"vllm:spec_decode_num_drafts": ..., ...}, "controller": {...}|null,
          "trace": [...]|null}
Phases run one after another in the same engine (the `mixed` workload changes batch size and text
between phases); each phase submits all its prompts at once, so batch = number of prompts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COUNTER_NAMES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
)


def _counters(llm) -> dict[str, float]:
    found: dict[str, float] = {name: 0.0 for name in COUNTER_NAMES}
    per_position: list[float] = []
    for metric in llm.get_metrics():
        if metric.name in found and hasattr(metric, "value"):
            found[metric.name] += float(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos" and hasattr(metric, "values"):
            per_position = [float(v) for v in metric.values]
    found["accepted_per_position"] = per_position  # type: ignore[assignment]
    return found


def _render(tokenizer, prompt: str, chat: bool) -> str:
    if not chat or not getattr(tokenizer, "chat_template", None):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def run(request: dict[str, Any]) -> dict[str, Any]:
    from vspec_runtime.spec import RuntimeSpec

    spec = RuntimeSpec.model_validate(request["spec"])
    run_dir = tempfile.mkdtemp(prefix="vspec-offline-")
    os.environ["VSPEC_SPEC"] = spec.to_json()
    os.environ["VSPEC_RUN_DIR"] = run_dir
    if spec.serving.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    from vllm import LLM, SamplingParams

    from vspec_cli.launch import vllm_engine_kwargs

    kwargs = vllm_engine_kwargs(spec, request["target_path"], request.get("drafter_path"))
    kwargs.update(request.get("engine_overrides", {}))  # e.g. enforce_eager for fast test starts
    llm = LLM(**kwargs, disable_log_stats=False, seed=0, enable_prefix_caching=False)
    tokenizer = llm.get_tokenizer()
    chat = bool(request.get("chat", True))
    if request.get("warmup", True):
        llm.generate([_render(tokenizer, "Hello", chat)], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)

    counters_before = _counters(llm)
    phases = []
    for phase in request["phases"]:
        prompts = [_render(tokenizer, p, chat) for p in phase["prompts"]]
        params = SamplingParams(temperature=0, max_tokens=int(phase["max_tokens"]), ignore_eos=bool(phase.get("ignore_eos", False)))
        started = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        outputs = [{"text": r.outputs[0].text, "token_ids": list(r.outputs[0].token_ids)} for r in results]
        phases.append({
            "name": phase.get("name", f"phase{len(phases)}"),
            "outputs": outputs,
            "elapsed_s": elapsed,
            "output_tokens": sum(len(o["token_ids"]) for o in outputs),
        })
    counters_after = _counters(llm)
    counters = {name: counters_after[name] - counters_before[name] for name in COUNTER_NAMES}
    before_pos = counters_before["accepted_per_position"]
    counters["accepted_per_position"] = [
        value - (before_pos[i] if i < len(before_pos) else 0.0)
        for i, value in enumerate(counters_after["accepted_per_position"])  # type: ignore[arg-type]
    ]
    snapshot_file = Path(run_dir) / "controller.json"
    time.sleep(0.3)  # let the engine publish its last snapshot (rate-limited to 4/s)
    controller = json.loads(snapshot_file.read_text()) if snapshot_file.exists() else None
    trace = None
    if spec.adaptive.trace and Path(spec.adaptive.trace).exists():
        trace = [json.loads(line) for line in Path(spec.adaptive.trace).read_text().splitlines() if line.strip()]
    return {"phases": phases, "counters": counters, "controller": controller, "trace": trace}


def main(argv: list[str]) -> int:
    request_path, result_path = argv[1], argv[2]
    request = json.loads(Path(request_path).read_text())
    result = run(request)
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
