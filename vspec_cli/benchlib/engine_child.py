"""One bench engine: ``python -m vspec_cli.benchlib.engine_child REQUEST.json RESULT.json``.

The request is vspec_cli.offline_run's. The result adds, per phase, what a per-cell report needs
and offline_run keeps only per run: vLLM's spec-decode counters, the controller's K selections
(from its snapshot, which the scheduler publishes before the last output of a batch is returned),
and ``time.perf_counter`` stamps. That clock is CLOCK_MONOTONIC, the one the controller's trace
uses in the engine-core process, so trace lines can be placed in phases.
If offline_run grows per-phase counters and stamps, this module can go.

Progress goes to stdout as lines ``@@vspec-bench {"phase": i, "phases": n, "name": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from vspec_cli.offline_run import COUNTER_NAMES, _counters, _render

PROGRESS_MARK = "@@vspec-bench "


def _progress(**fields: Any) -> None:
    print(PROGRESS_MARK + json.dumps(fields), flush=True)


def _selections(run_dir: str) -> Counter:
    path = Path(run_dir) / "controller.json"
    try:
        snapshot = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return Counter()
    return Counter({int(k): int(v) for k, v in snapshot.get("selections", {}).items()})


def _counter_delta(after: dict, before: dict) -> dict[str, Any]:
    delta: dict[str, Any] = {name: after[name] - before[name] for name in COUNTER_NAMES}
    old = before["accepted_per_position"]
    delta["accepted_per_position"] = [v - (old[i] if i < len(old) else 0.0)
                                      for i, v in enumerate(after["accepted_per_position"])]
    return delta


def run(request: dict[str, Any]) -> dict[str, Any]:
    from vspec_runtime.spec import RuntimeSpec

    spec = RuntimeSpec.model_validate(request["spec"])
    run_dir = tempfile.mkdtemp(prefix="vspec-bench-")
    os.environ["VSPEC_SPEC"] = spec.to_json()
    os.environ["VSPEC_RUN_DIR"] = run_dir
    if spec.serving.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    from vllm import LLM, SamplingParams

    from vspec_cli.launch import vllm_engine_kwargs

    _progress(stage="starting engine")
    started = time.perf_counter()
    kwargs = vllm_engine_kwargs(spec, request["target_path"], request.get("drafter_path"))
    kwargs.update(request.get("engine_overrides", {}))
    llm = LLM(**kwargs, disable_log_stats=False, seed=0, enable_prefix_caching=False)
    tokenizer = llm.get_tokenizer()
    chat = bool(request.get("chat", True))
    if request.get("warmup", True):
        llm.generate([_render(tokenizer, "Hello", chat)], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    engine_ready_s = time.perf_counter() - started

    phases = []
    total = len(request["phases"])
    counters = _counters(llm)
    selections = _selections(run_dir)
    for index, phase in enumerate(request["phases"]):
        _progress(stage="phase", phase=index, phases=total, name=phase.get("name", ""))
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
    _progress(stage="done", phases=total)
    trace = None
    if spec.adaptive.trace and Path(spec.adaptive.trace).exists():
        trace = [json.loads(line) for line in Path(spec.adaptive.trace).read_text().splitlines() if line.strip()]
    return {"phases": phases, "engine_ready_s": engine_ready_s, "trace": trace}


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text())
    Path(argv[2]).write_text(json.dumps(run(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
