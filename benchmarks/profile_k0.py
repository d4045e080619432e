"""Where does the time go when vspec serves at K=0? cProfile of one engine, engine core in-process.

Runs the demo preset (SmolLM2, n-gram drafter, or ``--drafter PATH`` as a draft model; ``--preset
demo-eagle`` for the EAGLE-3 head) with one of:
  target-only   no drafter, no speculative config, no vspec scheduler;
  k0            the n-gram drafter loaded, vspec's scheduler forced to K=0 (``table:1=0``);
  online        the same engine under the online controller (what its per-step work costs);
and profiles the engine step loop (scheduler + model runner + drafter, all in this process because
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) over ROUNDS batches of the chosen workload after one
warm-up batch. cProfile slows Python-heavy code more than torch kernels, so read its shares as
"where Python time goes", and take speed itself from `vspec bench`.

    .venv/bin/python benchmarks/profile_k0.py k0 --workload chat --batch 8 [--out bench-out/profile-k0]

Prints the step's total, the top functions by own time and the named spec-decode buckets; writes
the full pstats file for snakeviz/pstats.

``--timer`` replaces cProfile with wall-clock timers on a few named functions only (the engine
step, the scheduler with and without vspec's part, the runner's forward, sampler and drafter),
about a microsecond each, so the per-step Python is read at its real size, not cProfile's two- to
threefold. Run the modes one after another, several times: a process's forward speed moves +-2%.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Functions whose cumulative time says what speculation costs at K=0 (name substrings of pstats keys).
BUCKETS = {
    "engine step (total)": ("core.py", "step"),
    "scheduler.schedule": ("scheduler.py", "schedule"),
    "scheduler.update_from_output": ("scheduler.py", "update_from_output"),
    "model forward (execute_model)": ("gpu_model_runner.py", "execute_model"),
    "target forward": ("gpu_model_runner.py", "_model_forward"),
    "target logits": ("llama.py", "compute_logits"),
    "sample_tokens": ("gpu_model_runner.py", "sample_tokens"),
    "drafter propose (runner)": ("gpu_model_runner.py", "propose_draft_token_ids"),
    "eagle/draft propose": ("llm_base_proposer.py", "propose"),
    "ngram propose": ("ngram_proposer.py", "propose"),
    "_calc_spec_decode_metadata": ("gpu_model_runner.py", "_calc_spec_decode_metadata"),
    "_prepare_inputs": ("gpu_model_runner.py", "_prepare_inputs"),
    "_bookkeeping_sync": ("gpu_model_runner.py", "_bookkeeping_sync"),
    "take_draft_token_ids": ("gpu_model_runner.py", "take_draft_token_ids"),
    "update_draft_token_ids": ("scheduler.py", "update_draft_token_ids"),
    "_update_states": ("gpu_model_runner.py", "_update_states"),
    "vspec controller": ("controller.py", ""),
}


def build_request(mode: str, workload: str, batch: int, rounds: int, max_tokens: int,
                  drafter: str | None = None, preset: str = "demo") -> dict:
    sys.path.insert(0, str(REPO))
    from vspec_cli.benchlib.policies import parse_policies, policy_spec
    from vspec_cli.resolve import resolve_model_paths, resolve_spec
    from vspec_cli.workloads import load_workload

    base = resolve_spec(preset, None, {"method": "draft", "drafter": drafter} if drafter else {})
    policy = parse_policies({"target-only": "target-only", "k0": "table:1=0", "online": "online"}[mode])[0]
    spec = policy_spec(base, policy)
    paths = resolve_model_paths(spec, strict=True)
    phases = load_workload(workload).phases(batch, rounds + 1)
    return {
        "spec": json.loads(spec.to_json()), "target_path": paths.target, "drafter_path": paths.drafter,
        "phases": [{"name": p.name, "prompts": list(p.prompts), "max_tokens": max_tokens, "ignore_eos": True}
                   for p in phases],
        "warmup": True, "chat": True, "prefix_caching": False,
    }


def step_count(stats: pstats.Stats) -> int:
    """Engine steps profiled (calls of EngineCore.step)."""
    return max((calls for (filename, _line, name), (_cc, calls, *_rest) in stats.stats.items()
                if filename.endswith("core.py") and name == "step"), default=0)


def bucket_times(stats: pstats.Stats) -> dict[str, float]:
    found: dict[str, float] = {}
    for label, (file_part, func) in BUCKETS.items():
        total = 0.0
        for (filename, _line, name), (_cc, _nc, _tt, cumulative, _callers) in stats.stats.items():
            if filename.endswith(file_part) and (not func or name == func):
                total = max(total, cumulative) if func else total + _tt
        found[label] = total
    return found


class StepTimers:
    """Cumulative wall time and calls of named methods, wrapped on the live engine's objects."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}

    def wrap(self, owner: object, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)
        slot = self.totals.setdefault(name, [0.0, 0])

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                slot[0] += time.perf_counter() - started
                slot[1] += 1

        setattr(owner, attribute, timed)

    def per_step_ms(self) -> dict[str, float]:
        steps = max(self.totals.get("engine step", [0.0, 1])[1], 1)
        return {name: round(1000 * total / steps, 3) for name, (total, _calls) in self.totals.items()}


def attach_timers(engine) -> StepTimers:
    """Timers on the in-process engine core, its scheduler and its model runner. The base Scheduler's
    methods are wrapped on the class first, then the scheduler's own on the instance: vspec's subclass
    reaches the base through super(), so "(all)" minus "(vLLM's)" is vspec's part (0 for target-only)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    core = engine.llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    timers = StepTimers()
    timers.wrap(core, "step_fn", "engine step")
    for method in ("schedule", "update_from_output"):
        timers.wrap(Scheduler, method, f"{method} (vLLM's)")
        timers.wrap(core.scheduler, method, f"{method} (all)")
    for method in ("execute_model", "_model_forward", "sample_tokens", "propose_draft_token_ids", "_prepare_inputs",
                   "_update_states", "take_draft_token_ids"):
        if hasattr(runner, method):
            timers.wrap(runner, method, method)
    controller = getattr(core.scheduler, "_vspec", None)
    if controller is not None:  # vspec's share of the scheduler, part by part
        from vspec_runtime import vllm_adapter

        for method in ("choose_gamma", "observe_step", "_maybe_publish"):
            timers.wrap(controller, method, f"vspec {method}")
        for function in ("drafting_batch_size", "verified_drafts", "observed_step"):
            timers.wrap(vllm_adapter, function, f"vspec adapter {function}")
    return timers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["target-only", "k0", "online"])
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--drafter", help="a draft model folder (method draft) instead of n-gram drafting, "
                                          "e.g. the output of benchmarks/useless_drafter.py")
    parser.add_argument("--preset", default="demo", help="the preset whose model and drafter run (demo-eagle: EAGLE-3)")
    parser.add_argument("--out", default="bench-out/profile-k0")
    parser.add_argument("--timer", action="store_true", help="wall-clock timers on named functions, no cProfile")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process, so cProfile sees it
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from vspec_cli.offline_run import Engine

    request = build_request(args.mode, args.workload, args.batch, args.rounds, args.max_tokens, args.drafter,
                            args.preset)
    engine = Engine(request)
    engine.run_phase(request["phases"][0])  # warm-up batch, not profiled
    if args.timer:
        run_timed(engine, request, args)
        return
    profiler = cProfile.Profile()
    tokens, started = 0, time.perf_counter()
    profiler.enable()
    for index, phase in enumerate(request["phases"][1:], start=1):
        tokens += engine.run_phase(phase, index)["output_tokens"]
    profiler.disable()
    elapsed = time.perf_counter() - started
    name = f"{args.preset}-{args.mode}{'-draft' if args.drafter else ''}-{args.workload}@{args.batch}"
    profiler.dump_stats(out / f"{name}.pstats")
    stats = pstats.Stats(profiler)
    buckets = bucket_times(stats)
    steps = step_count(stats)
    # What a step costs around the target's forward and logits (which run the same kernels in every
    # mode and swing +-4% from run to run): the per-step Python that K=0 should not add.
    around = buckets["engine step (total)"] - buckets["target forward"] - buckets["target logits"]
    summary = {"mode": args.mode, "cell": f"{args.workload}@{args.batch}", "tokens": tokens,
               "elapsed_s": round(elapsed, 3), "tok_per_s": round(tokens / elapsed, 2), "steps": steps,
               "around_forward_ms_per_step": round(1000 * around / max(steps, 1), 2),
               "buckets_s": {k: round(v, 3) for k, v in buckets.items()}}
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())


def run_timed(engine, request: dict, args) -> None:
    timers = attach_timers(engine)
    tokens, started = 0, time.perf_counter()
    for index, phase in enumerate(request["phases"][1:], start=1):
        tokens += engine.run_phase(phase, index)["output_tokens"]
    elapsed = time.perf_counter() - started
    per_step = timers.per_step_ms()
    around = per_step["engine step"] - per_step.get("_model_forward", 0.0)
    summary = {"mode": args.mode, "cell": f"{args.workload}@{args.batch}", "tokens": tokens,
               "elapsed_s": round(elapsed, 3), "tok_per_s": round(tokens / elapsed, 2),
               "steps": timers.totals["engine step"][1], "around_forward_ms_per_step": round(around, 3),
               "ms_per_step": per_step}
    name = f"{args.preset}-{args.mode}-{args.workload}@{args.batch}-timer"
    with (Path(args.out) / f"{name}.jsonl").open("a", encoding="utf-8") as runs:
        runs.write(json.dumps(summary) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
