"""What a speculation length costs under live arrivals: every engine step timed, admissions apart.

The serving bench (`vspec bench --driver serve`) measures the whole server: requests, streaming, the
API process, and intervals too wide to tell 2% at overload. This drives one offline vLLM engine
(`LLMEngine`, the demo's settings, prefix caching on as `vspec serve` runs it) with Poisson arrivals
of the copy, code and chat prompts (max 48 tokens each, EOS ignored so every config does the same
work), and times each `step()`. Steps are split into pure decode and admission steps (a request's
first token came out: its prompt was prefilled in that step), so one can see what K changes (the
decode steps) and what it does not (the prefill). Configs:

  none             no speculation (target-only);
  ngram:K          vLLM's own n-gram drafter at K (no vspec);
  vspec-fixed:K    the demo preset through vspec's scheduler at a constant K (as the bench's fixed:K).

    .venv/bin/python benchmarks/arrival_steps.py none ngram:1 vspec-fixed:1 --rate 4 --duration 30

One engine per config, one after another (about 2.5 minutes each on a 2-core machine); in --out a
JSON file per config with every step, and the engine's log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL_BATCH = 14  # steps with at least this many requests are "busy" (max_num_seqs is 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="none, ngram:K or vspec-fixed:K")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "arrival-steps")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one config in this process
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        run_one(args.one, args.rate, args.duration, args.out / f"{args.one.replace(':', '-')}.json")
        return
    for config in args.configs:
        spec_for(config)
    for config in args.configs:
        # One process per engine: vLLM leaves its workers and memory to the process that made them.
        command = [sys.executable, __file__, config, "--one", config, "--rate", str(args.rate),
                   "--duration", str(args.duration), "--out", str(args.out)]
        log = args.out / f"{config.replace(':', '-')}.log"
        with log.open("w") as sink:
            if subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode:
                raise SystemExit(f"{config}: the engine run failed; its log: {log}")
    for config in args.configs:
        summarise(config, json.loads((args.out / f"{config.replace(':', '-')}.json").read_text()))


def spec_for(config: str):
    """The demo preset as ``config`` runs it (a clear exit on an unknown config)."""
    from vspec_cli.resolve import resolve_spec

    kind, _, gamma = config.partition(":")
    if kind == "none" and not gamma:
        return resolve_spec("demo", None, {}, no_speculation=True)
    if kind in ("ngram", "vspec-fixed") and gamma.isdigit() and 1 <= int(gamma) <= 6:
        if kind == "ngram":  # vLLM's own n-gram path: no vspec scheduler
            return resolve_spec("demo", None, {"gamma": int(gamma), "adaptive": {"enabled": False}})
        return resolve_spec("demo", None, {"adaptive": {"policy": "fixed", "fixed_gamma": int(gamma)}})
    raise SystemExit(f"unknown config {config!r}: none, ngram:K or vspec-fixed:K (K in 1..6)")


def engine_kwargs(spec, run_dir: str) -> dict:
    """vLLM's keyword arguments as vspec's bench engines get them, with prefix caching on (as `vspec
    serve` runs) and synchronous scheduling; the engine's environment goes into this process's."""
    from vspec_cli.launch import vllm_engine_kwargs
    from vspec_cli.offline_run import engine_environment
    from vspec_cli.resolve import resolve_model_paths

    os.environ.update(engine_environment(spec, run_dir))
    target = resolve_model_paths(spec, strict=True).target
    return {**vllm_engine_kwargs(spec, target, None), "enable_prefix_caching": True, "seed": 0,
            "async_scheduling": False}


def prompts(tokenizer) -> list[str]:
    from vspec_cli.offline_run import _render
    from vspec_cli.workloads import load_workload

    return [_render(tokenizer, text, chat=True) for name in ("copy", "code", "chat")
            for phase in load_workload(name).phases(8, 6) for text in phase.prompts]


def arrival_times(rate: float, duration: float) -> list[float]:
    rng, now, times = random.Random(0), 0.0, []
    while (now := now + rng.expovariate(rate)) <= duration:
        times.append(now)
    return times


def run_one(config: str, rate: float, duration: float, out: Path) -> None:
    kwargs = engine_kwargs(spec_for(config), tempfile.mkdtemp(prefix="vspec-arrivals-"))
    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    texts = prompts(engine.get_tokenizer())
    engine.add_request("warm-up", texts[0], SamplingParams(temperature=0, max_tokens=8))
    while engine.has_unfinished_requests():
        engine.step()
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    arrivals, added, seen, steps = arrival_times(rate, duration), 0, set(), []
    begin = time.perf_counter()
    while added < len(arrivals) or engine.has_unfinished_requests():
        now = time.perf_counter() - begin
        while added < len(arrivals) and arrivals[added] <= now:
            engine.add_request(f"r{added}", texts[added % len(texts)], params)
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[added] - now))
            continue
        started = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - started
        first = sum(1 for output in outputs if output.request_id not in seen)
        seen.update(output.request_id for output in outputs)
        steps.append({"at_s": started - begin, "ms": elapsed * 1000, "requests": len(outputs), "admitted": first,
                      "tokens": sum(len(output.outputs[0].token_ids) for output in outputs if output.outputs)})
    out.write_text(json.dumps({"config": config, "rate": rate, "duration_s": duration, "requests": len(arrivals),
                               "makespan_s": time.perf_counter() - begin, "steps": steps}))


def summarise(config: str, run: dict) -> None:
    steps = run["steps"]
    tokens = sum(step["tokens"] for step in steps)
    print(f"{config}: {run['requests']} requests, {tokens / run['makespan_s']:.1f} output tok/s, "
          f"{len(steps)} steps, {sum(s['ms'] for s in steps if s['admitted']) / sum(s['ms'] for s in steps):.0%} "
          "of the time in admission steps")
    busy = [step for step in steps if step["requests"] >= FULL_BATCH]
    for label, group in (("decode", [s for s in busy if not s["admitted"]]), ("admission", [s for s in busy if s["admitted"]])):
        if not group:
            continue
        ms = statistics.mean(step["ms"] for step in group)
        per_step = statistics.mean(step["tokens"] for step in group)
        rate = sum(step["tokens"] for step in group) / sum(step["ms"] for step in group) * 1000
        print(f"  busy {label:9} steps: {len(group):4d}, {ms:6.1f} ms, {per_step:5.2f} tokens a step, {rate:6.1f} tok/s")


if __name__ == "__main__":
    main()
