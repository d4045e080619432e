"""The demo's EAGLE heads in real vLLM (CPU): lossless, and real drafters.

Greedy output with each head at a fixed K=3 must be token-identical to target-only, and the head must
really draft: a random head's mean acceptance length is 1.0 to two decimals. The EAGLE-1 head
(smollm2-eagle) measured 1.31 on the bench's held-out chat prompts, so 1.15 catches a head that was
swapped, corrupted or fed the wrong hidden states; the EAGLE-3 head (smollm2-eagle3, the preset's)
measured 1.65-1.85 (docs/benchmarks.md), so 1.4 catches the same for it, and a d2t map or aux-layer
order gone wrong (either drops acceptance to about 1.0).
"""

from __future__ import annotations

import pytest

from conftest import run_offline
from vspec_cli import model_store
from vspec_cli.workloads import CHAT_QUESTIONS

pytestmark = pytest.mark.vllm

PROMPTS = list(CHAT_QUESTIONS[:3])


def request(method: str, target, drafter, gamma: int) -> dict:
    spec = {"method": method, "target_model": str(target), "drafter": drafter and str(drafter), "gamma": gamma,
            "adaptive": {"enabled": False},
            "serving": {"dtype": "float32", "max_model_len": 1024, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 8, "device": "cpu"}}
    return {"spec": spec, "target_path": str(target), "drafter_path": drafter and str(drafter), "chat": True,
            "phases": [{"name": "chat", "prompts": PROMPTS, "max_tokens": 96}]}


def ids(result: dict) -> list:
    return [out["token_ids"] for out in result["phases"][0]["outputs"]]


@pytest.fixture(scope="module")
def target_only(demo_model_dir, tmp_path_factory) -> dict:
    return run_offline(request("none", demo_model_dir, None, 3), tmp_path_factory.mktemp("target-only"))


@pytest.mark.parametrize("method, drafter, floor", [("eagle", "smollm2-eagle", 1.15), ("eagle3", "smollm2-eagle3", 1.4)])
def test_eagle_head_is_lossless_and_accepted(demo_model_dir, target_only, tmp_path, method, drafter, floor):
    head = model_store.resolve(drafter).path
    assert head is not None, f"drafters/{drafter} is missing"
    eagle = run_offline(request(method, demo_model_dir, head, 3), tmp_path)
    assert ids(eagle) == ids(target_only)
    counters = eagle["counters"]
    acceptance_length = 1 + counters["vllm:spec_decode_num_accepted_tokens"] / counters["vllm:spec_decode_num_drafts"]
    assert acceptance_length >= floor, counters
