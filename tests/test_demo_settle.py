"""Where the online controller settles on the real demo model (SmolLM2-135M-Instruct, CPU).

Two engines, the two ends of issue 3's SmolLM2 check:
  - ngram drafting on copy prompts: drafts are free and mostly right, so K must settle high;
  - a useless draft model (SmolLM2's first 8 layers) on chat: every draft costs time and is almost
    always wrong, so K must settle at its minimum, 0.
The margins are wide on purpose (copy at K=6 is about 3x target-only here; the truncated drafter at
any K>0 is slower than target-only), so machine noise cannot flip the answer.
`benchmarks/settle.py` prints the same numbers for the docs.
"""

from __future__ import annotations

import pytest

from conftest import CACHE, run_offline
from vspec_cli.workloads import CHAT_QUESTIONS, copy_passages

pytestmark = pytest.mark.vllm

MAX_GAMMA = 6


def settle_request(method: str, target, drafter, prompts, trace) -> dict:
    spec = {"method": method, "target_model": str(target), "drafter": drafter and str(drafter), "gamma": MAX_GAMMA,
            "adaptive": {"enabled": True, "policy": "online", "min_gamma": 0, "trace": str(trace)},
            "serving": {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 8, "device": "cpu"}}
    return {"spec": spec, "target_path": str(target), "drafter_path": drafter and str(drafter), "chat": True,
            "phases": [{"name": f"p{i}", "prompts": [p], "max_tokens": 128} for i, p in enumerate(prompts)]}


def k_shares(result: dict) -> dict[int, float]:
    """Share of decode steps run at each K over the measured phases (the controller's own counts)."""
    selections = {int(k): v for k, v in result["controller"]["selections"].items()}
    total = sum(selections.values())
    assert total >= 20, f"too few decode steps to judge: {selections}"
    return {k: n / total for k, n in sorted(selections.items())}


def acceptance_length(result: dict) -> float:
    counters = result["counters"]
    return 1 + counters["vllm:spec_decode_num_accepted_tokens"] / max(counters["vllm:spec_decode_num_drafts"], 1)


def test_ngram_on_copy_settles_high(demo_model_dir, tmp_path):
    prompts = copy_passages()[0][:2]
    result = run_offline(settle_request("ngram", demo_model_dir, None, prompts, tmp_path / "t.jsonl"), tmp_path)
    assert acceptance_length(result) >= 2.5, result["counters"]
    shares = k_shares(result)
    assert sum(share for k, share in shares.items() if k >= 4) >= 0.7, shares


def test_useless_drafter_settles_at_zero(demo_model_dir, tmp_path):
    import tiny_models

    drafter = CACHE / "models" / "smollm2-8-layers"
    if not (drafter / "config.json").exists():
        tiny_models.build_truncated_copy(drafter, demo_model_dir, layers=8)
    result = run_offline(settle_request("draft", demo_model_dir, drafter, CHAT_QUESTIONS[:2], tmp_path / "t.jsonl"),
                         tmp_path)
    assert acceptance_length(result) < 1.5, result["counters"]  # the premise: this drafter is useless
    shares = k_shares(result)
    assert shares.get(0, 0.0) >= 0.7, shares
