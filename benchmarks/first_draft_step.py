"""Does the first drafting round pay for compiling the n-gram kernels? One engine, in this process.

Runs the demo preset's engine as the interleaved bench does (vspec's scheduler holding two labelled
policies), warms it up like the bench (one 4-token request), then chat@1 rounds: two at K=0
(``table:1=0``, the drafter never asked), then four at ``fixed:6``. Prints each round's seconds.
Without the ``ngram-jit-warmup`` patch the first ``fixed:6`` round is the slow one (about 1.5 s of
numba compilation on this 2-core machine); with it, it runs like the rounds after it.

    .venv/bin/python benchmarks/first_draft_step.py 2>/dev/null | grep '^round'
    VSPEC_DISABLE_PATCHES=ngram-jit-warmup .venv/bin/python benchmarks/first_draft_step.py 2>/dev/null | grep '^round'

(vLLM logs to stdout in this process; the grep keeps the rounds.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LABELS = ("table:1=0", "fixed:6")


def build_request() -> dict:
    sys.path.insert(0, str(REPO))
    from vspec_cli.benchlib.interleave import scheduler_policy_settings
    from vspec_cli.benchlib.policies import parse_policies
    from vspec_cli.resolve import resolve_model_paths, resolve_spec
    from vspec_runtime.spec import validate_spec

    base = resolve_spec("demo", None, {})
    paths = resolve_model_paths(base, strict=True)
    labelled = {p.label: scheduler_policy_settings(base, p) for p in parse_policies(",".join(LABELS))}
    data = base.model_dump()
    data.update(adaptive=dict(labelled[LABELS[0]]["adaptive"], enabled=True, min_gamma=0))
    return {"spec": json.loads(validate_spec(data).to_json()), "target_path": paths.target,
            "drafter_path": paths.drafter, "warmup": True, "chat": True, "prefix_caching": False,
            "engine_overrides": {}, "bench_policies": labelled}


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vspec_cli.offline_run import Engine
    from vspec_cli.workloads import load_workload

    engine = Engine(build_request())
    rounds = load_workload("chat").phases(1, 6)
    for index, phase in enumerate(rounds):
        label = LABELS[0] if index < 2 else LABELS[1]
        engine.select_policy(label)
        started = time.perf_counter()
        result = engine.run_phase({"name": phase.name, "prompts": list(phase.prompts), "max_tokens": 64,
                                   "ignore_eos": True}, index)
        print(f"round {index + 1} {label:10s} {time.perf_counter() - started:6.2f} s "
              f"({result['output_tokens']} tokens)", flush=True)


if __name__ == "__main__":
    main()
