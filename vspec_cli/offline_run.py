"""One offline engine run in its own process: a RuntimeSpec, prompts in, tokens and counters out.

Used by `vspec bench`, `vspec profile collect` and the integration tests. Run as::

    python -m vspec_cli.offline_run [--progress] REQUEST.json RESULT.json   # all phases, then exit
    python -m vspec_cli.offline_run --serve-phases REQUEST.json             # phases from stdin (serve_phases)

The second form keeps one warm engine while `vspec bench` interleaves policies in it (with
``"bench_policies"`` in the request the controller holds one policy per label; see
vspec_runtime/control/switch.py).

REQUEST: {"spec": {...RuntimeSpec...}, "target_path": str, "drafter_path": str|null,
          "phases": [{"name": str, "prompts": [str, ...], "max_tokens": int, "ignore_eos": bool,
                      "sampling": {...}|[{...} per prompt]|null, "logprobs": bool}],
          "warmup": bool, "chat": bool, "prefix_caching": bool, "engine_overrides": {...vllm.LLM kwargs...}}
RESULT:  {"phases": [{"name", "outputs": [{"text", "token_ids", "logprobs"?}], "elapsed_s", "started_at", "ended_at",
                      "output_tokens", "counters": {...}, "selections": {"K": steps}}],
          "counters": {"vllm:spec_decode_num_drafts": ..., ...}, "controller": {...}|null,
          "trace": [...]|null, "engine_ready_s": float}
Phases run one after another in the same engine (the `mixed` workload changes batch size and text
between phases); each phase submits all its prompts at once, so batch = number of prompts.

Sampling: greedy unless a phase gives ``sampling`` (``temperature``, ``top_p``, ``top_k``, ``seed``,
``max_tokens`` (the phase's own unless set here), and ``extra_args``, what the OpenAI API's
``vllm_xargs`` become, e.g. ``{"vspec_max_draft": 0}``), one dict for every prompt or a list with
one dict per prompt (greedy and sampled requests can share a phase: ``{"temperature": 0}`` is greedy). With ``"logprobs": true`` each output also carries the
target model's log-probability of every generated token (vLLM's raw logprobs: the target's own
distribution at temperature 1, whatever the request's sampling settings), which `vspec bench` and
the losslessness tests use as a quality measure. Prefix caching is on unless ``prefix_caching`` is
false, as `vspec serve` runs.

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
from typing import IO, Any, Callable, Optional

COUNTER_NAMES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
)
PROGRESS_MARK = "@@vspec-bench "
PHASE_MARK = "@@vspec-phase "  # --serve-phases: one finished phase
DONE_MARK = "@@vspec-done "  # --serve-phases: the engine's totals, after the input ended

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


def sampling_params(phase: dict[str, Any]) -> list[Any]:
    """One vLLM SamplingParams per prompt of ``phase`` (greedy unless it says otherwise)."""
    from vllm import SamplingParams

    count = len(phase["prompts"])
    sampling = phase.get("sampling") or {}
    per_prompt = sampling if isinstance(sampling, list) else [sampling] * count
    if len(per_prompt) != count:
        raise ValueError(f"phase {phase.get('name')!r}: {len(per_prompt)} sampling entries for {count} prompts")
    common = dict(max_tokens=int(phase["max_tokens"]), ignore_eos=bool(phase.get("ignore_eos", False)),
                  logprobs=0 if phase.get("logprobs") else None)
    return [SamplingParams(**(common | _sampling_fields(entry))) for entry in per_prompt]


def _sampling_fields(entry: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {"temperature": float(entry.get("temperature", 0.0))}
    for name, cast in (("top_p", float), ("top_k", int), ("seed", int), ("max_tokens", int), ("extra_args", dict)):
        if entry.get(name) is not None:
            fields[name] = cast(entry[name])
    return fields


def _output_record(completion, with_logprobs: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"text": completion.text, "token_ids": list(completion.token_ids)}
    if with_logprobs:
        # Each entry maps token id -> Logprob; with logprobs=0 it holds the generated token (and no others).
        record["logprobs"] = [float(step[token].logprob) for token, step in zip(completion.token_ids, completion.logprobs)]
    return record


def engine_environment(spec, run_dir: str, bench_policies: Optional[list] = None) -> dict[str, str]:
    """What the engine's processes read: the spec, the run folder, the bench's policy labels, and the
    visible devices ``serving.device`` names, and the CPU wheel's defaults (the same variables `vspec serve`
    sets)."""
    from vspec_cli.launch import cpu_build_environment, device_environment

    env = {"VSPEC_SPEC": spec.to_json(), "VSPEC_RUN_DIR": run_dir, **cpu_build_environment(),
           **device_environment(spec.serving.device)}
    if bench_policies:
        env["VSPEC_BENCH_POLICIES"] = json.dumps(bench_policies)
    return env


class Engine:
    """One vLLM engine (offline ``LLM``) with vspec's environment, running phases one after another."""

    def __init__(self, request: dict[str, Any], progress: Progress = _no_progress) -> None:
        from vspec_runtime.spec import RuntimeSpec

        self.spec = RuntimeSpec.model_validate(request["spec"])
        self.run_dir = tempfile.mkdtemp(prefix="vspec-offline-")
        os.environ.update(engine_environment(self.spec, self.run_dir, request.get("bench_policies")))

        from vllm import LLM, SamplingParams

        from vspec_cli.launch import parallel_environment, vllm_engine_kwargs
        from vspec_cli.parallel_layout import engine_layout

        progress(stage="starting engine")
        started = time.perf_counter()
        kwargs = vllm_engine_kwargs(self.spec, request["target_path"], request.get("drafter_path"))
        kwargs.update(request.get("engine_overrides", {}))  # e.g. enforce_eager for fast test starts
        # TP/PP from engine_overrides: one core group per CPU worker, as `vspec serve` sets it.
        os.environ.update(parallel_environment(self.spec.serving.device, engine_layout(kwargs)))
        self.llm = LLM(**kwargs, disable_log_stats=False, seed=0,
                       enable_prefix_caching=bool(request.get("prefix_caching", True)))
        self.tokenizer = self.llm.get_tokenizer()
        self.chat = bool(request.get("chat", True))
        if request.get("warmup", True):
            self.llm.generate([_render(self.tokenizer, "Hello", self.chat)], SamplingParams(temperature=0, max_tokens=4),
                              use_tqdm=False)
        self.ready_s = time.perf_counter() - started
        self.first_counters = self.counters = _counters(self.llm)
        self.selections = _selections(self.run_dir)

    def select_policy(self, label: Optional[str]) -> None:
        """Interleaved bench: the controller runs ``label`` from the next request on (read when idle)."""
        if label:
            from vspec_runtime.controller import BENCH_POLICY_FILE

            (Path(self.run_dir) / BENCH_POLICY_FILE).write_text(label)

    def run_phase(self, phase: dict[str, Any], index: int = 0) -> dict[str, Any]:
        prompts = [_render(self.tokenizer, p, self.chat) for p in phase["prompts"]]
        params = sampling_params(phase)
        phase_start = time.perf_counter()
        results = self.llm.generate(prompts, params, use_tqdm=False)
        phase_end = time.perf_counter()
        after, after_selections = _counters(self.llm), _selections(self.run_dir)
        outputs = [_output_record(r.outputs[0], bool(phase.get("logprobs"))) for r in results]
        record = {
            "name": phase.get("name", f"phase{index}"),
            "outputs": outputs,
            "elapsed_s": phase_end - phase_start,
            "started_at": phase_start,
            "ended_at": phase_end,
            "output_tokens": sum(len(o["token_ids"]) for o in outputs),
            "counters": _counter_delta(after, self.counters),
            "selections": {str(k): v for k, v in sorted((after_selections - self.selections).items())},
        }
        self.counters, self.selections = after, after_selections
        return record

    def finish(self) -> dict[str, Any]:
        """Totals, the controller's last snapshot and its trace."""
        time.sleep(0.3)  # let the engine publish its last snapshot (rate-limited to 4/s)
        trace = None
        if self.spec.adaptive.trace and Path(self.spec.adaptive.trace).exists():
            trace = [json.loads(line) for line in Path(self.spec.adaptive.trace).read_text().splitlines() if line.strip()]
        return {"counters": _counter_delta(self.counters, self.first_counters), "controller": _snapshot(self.run_dir),
                "trace": trace, "engine_ready_s": self.ready_s}


def run(request: dict[str, Any], progress: Progress = _no_progress) -> dict[str, Any]:
    engine = Engine(request, progress)
    phases = []
    total = len(request["phases"])
    for index, phase in enumerate(request["phases"]):
        progress(stage="phase", phase=index, phases=total, name=phase.get("name", ""))
        phases.append(engine.run_phase(phase, index))
    progress(stage="done", phases=total)
    return {"phases": phases, **engine.finish()}


def serve_phases(request: dict[str, Any], commands: IO[str]) -> None:
    """Interleaved bench: start the engine, then run phases as the driver sends them, one JSON line each.

    In: ``{"phase": {...}, "policy": label|null}`` per line; end of input ends the engine.
    Out (stdout): ``@@vspec-bench {"stage": "ready", ...}``, then one ``@@vspec-phase {...}`` per phase
    (the phase record of `run`), then ``@@vspec-done {...}`` (what `run` returns besides the phases).
    """
    engine = Engine(request)
    print_progress(stage="ready", engine_ready_s=engine.ready_s)
    for index, line in enumerate(commands):
        if not line.strip():
            continue
        command = json.loads(line)
        engine.select_policy(command.get("policy"))
        print(PHASE_MARK + json.dumps(engine.run_phase(command["phase"], index)), flush=True)
    print(DONE_MARK + json.dumps(engine.finish()), flush=True)


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args and args[0] == "--serve-phases":
        serve_phases(json.loads(Path(args[1]).read_text()), sys.stdin)
        return 0
    progress = _no_progress
    if args and args[0] == "--progress":
        progress, args = print_progress, args[1:]
    request_path, result_path = args
    result = run(json.loads(Path(request_path).read_text()), progress)
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
