"""EAGLE-3 heads with a REDUCED draft vocabulary for a Llama target, served by vspec on vLLM's CPU build.

The head is in the layout the EAGLE-3 trainer exports (tests/tiny_models.py:build_llama_eagle3_head):
fc over the target's aux hidden states at vLLM's default layers (2, L//2, L-3), one decoder layer over
cat[embed, hidden], its own lm_head over N << vocab tokens and ``d2t`` (target id = i + d2t[i]),
fp16 safetensors, ``method=eagle3``. vLLM's ``Eagle3LlamaForCausalLM`` scatters the N draft logits
into a full-vocabulary row (-inf elsewhere), so a draft is always a target id.

The loader test builds only the head in vLLM (no engine) and checks d2t and the logit scatter directly.
One engine pair, shared by the other tests: target-only, and eagle3 under vspec's adaptive scheduler
(a K sweep 3, 0, 2 so K changes and passes through the K=0 fast path), both fp32 on CPU. Proven:
the engine starts through vspec's launch path; greedy output is token-identical to target-only;
drafts were proposed, some accepted and some rejected (the head drafts "what the target predicted
one position earlier" within its draft vocabulary, right only when the target repeats itself);
sampled requests follow the target's distribution (the statistics of tests/test_sampling_lossless.py)
and greedy rows batched with sampled ones stay identical.
"""

from __future__ import annotations

import json

import pytest

import draft_loader
from conftest import CACHE, run_offline
from sampling_stats import distribution_problems

pytestmark = pytest.mark.vllm

DRAFT_VOCAB = 2048
TEMPERATURE, TOP_P = 0.8, 0.95
PROMPTS = [
    "one two three one two three one two three one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
]


@pytest.fixture(scope="module")
def eagle3_models(demo_model_dir) -> dict:
    import tiny_models as tm

    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    root = CACHE / "tiny"
    target, head = root / "llama-eagle3-target", root / "llama-eagle3-head"
    if not (target / "config.json").exists():
        tm.build_llama_for_eagle3(target, demo_model_dir, seed=7, vocab_size=vocab)
    if not (head / "config.json").exists():
        tm.build_llama_eagle3_head(head, target, seed=8, draft_vocab=DRAFT_VOCAB)
    return {"target": target, "head": head, "vocab": vocab}


def engine_spec(method: str, target: str, drafter: str | None, trace: str | None) -> dict:
    adaptive = {"enabled": False}
    if method != "none":
        adaptive = {"enabled": True, "policy": "sweep", "sweep_gammas": [3, 0, 2], "control_interval": 2,
                    "min_gamma": 0, "gamma0_mode": "sync", "trace": trace}
    return {"method": method, "target_model": target, "drafter": drafter, "gamma": 3, "adaptive": adaptive,
            "serving": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 32, "device": "cpu"}}


def phases() -> list[dict]:
    sampled_prompts = [prompt for prompt in PROMPTS[:2] for _ in range(48)]
    mixed_prompts, mixed_sampling = [], []
    for index, prompt in enumerate(PROMPTS):
        mixed_prompts += [prompt, prompt]
        mixed_sampling += [{"temperature": 0.0}, {"temperature": TEMPERATURE, "top_p": TOP_P, "seed": 50_000 + index}]
    return [
        {"name": "greedy", "prompts": PROMPTS, "max_tokens": 32, "ignore_eos": True},
        {"name": "single", "prompts": PROMPTS[:1], "max_tokens": 32, "ignore_eos": True},
        {"name": "sampled", "prompts": sampled_prompts, "logprobs": True, "max_tokens": 8, "ignore_eos": True,
         "sampling": [{"temperature": TEMPERATURE, "top_p": TOP_P, "seed": i} for i in range(len(sampled_prompts))]},
        {"name": "mixed", "prompts": mixed_prompts, "sampling": mixed_sampling, "max_tokens": 24, "ignore_eos": True},
    ]


@pytest.fixture(scope="module")
def runs(eagle3_models, tmp_path_factory) -> dict:
    target, head = str(eagle3_models["target"]), str(eagle3_models["head"])
    results = {}
    for method, drafter in (("none", None), ("eagle3", head)):
        folder = tmp_path_factory.mktemp(f"eagle3-{method}")
        trace = str(folder / "trace.jsonl") if drafter else None
        # Seeds differ between the engines: the sampled comparison is between independent samples.
        request = {"spec": engine_spec(method, target, drafter, trace), "target_path": target,
                   "drafter_path": drafter, "chat": False, "engine_overrides": {"enforce_eager": True},
                   "phases": phases()}
        if drafter:
            for entry in request["phases"][2]["sampling"]:
                entry["seed"] += 100_000
        results[method] = run_offline(request, folder)
    return results


def phase(result: dict, name: str) -> dict:
    return next(p for p in result["phases"] if p["name"] == name)


def ids(result: dict, name: str) -> list[list[int]]:
    return [out["token_ids"] for out in phase(result, name)["outputs"]]


def test_the_head_is_in_the_trainer_layout(eagle3_models):
    from safetensors.torch import load_file

    head, target = eagle3_models["head"], eagle3_models["target"]
    config = json.loads((head / "config.json").read_text())
    target_config = json.loads((target / "config.json").read_text())
    hidden, layers = target_config["hidden_size"], target_config["num_hidden_layers"]
    assert config["draft_vocab_size"] == DRAFT_VOCAB < eagle3_models["vocab"]
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, layers // 2, layers - 3],
                                      "use_aux_hidden_state": True}
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    tensors = load_file(str(head / "model.safetensors"))
    assert tensors["fc.weight"].shape == (hidden, 3 * hidden)
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, hidden)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * hidden
    assert not any("embed_tokens" in name for name in tensors)
    assert {str(t.dtype) for n, t in tensors.items() if n not in ("d2t", "t2d")} == {"torch.float16"}
    import torch
    draft_ids = torch.arange(DRAFT_VOCAB) + tensors["d2t"]
    assert bool((draft_ids[1:] > draft_ids[:-1]).all()) and int(draft_ids[-1]) < eagle3_models["vocab"]
    assert target_config["eos_token_id"] in draft_ids.tolist()
    assert tensors["t2d"].sum() == DRAFT_VOCAB and bool(tensors["t2d"][draft_ids].all())


LOADER_PROBE = r"""
hidden = model.config.hidden_size
probe = torch.randn(4, hidden, generator=torch.Generator().manual_seed(0))
aux = torch.randn(2, 3 * hidden, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    logits = model.compute_logits(probe)
    expected = probe @ checkpoint["lm_head.weight"].float().T
    combined = model.combine_hidden_states(aux)
draft_ids = torch.arange(len(checkpoint["d2t"])) + checkpoint["d2t"]
finite = torch.isfinite(logits)
print("RESULT=" + json.dumps({
    "class": type(model).__name__,
    "d2t_loaded": bool(torch.equal(model.draft_id_to_target_id.cpu(), checkpoint["d2t"])),
    "logits_shape": list(logits.shape),
    "finite_ids": sorted(set(finite.nonzero()[:, 1].tolist())) == draft_ids.tolist(),
    "finite_per_row": finite.sum(1).tolist(),
    "logit_error": (logits[:, draft_ids] - expected).abs().max().item(),
    "fc_error": (combined - aux @ checkpoint["fc.weight"].float().T).abs().max().item(),
}))
"""


def test_vllm_loads_the_reduced_vocabulary_and_maps_drafts_to_target_ids(eagle3_models):
    """Through vLLM's model loader: d2t lands in draft_id_to_target_id, the N draft logits are the
    head's lm_head scattered to target ids i + d2t[i] (every other id -inf), fc is the checkpoint's."""
    found, _ = draft_loader.probe(eagle3_models["target"], eagle3_models["head"], "eagle3", LOADER_PROBE)
    assert found["class"] == "Eagle3LlamaForCausalLM"
    assert found["d2t_loaded"]
    assert found["logits_shape"] == [4, eagle3_models["vocab"]]
    assert found["finite_ids"] and found["finite_per_row"] == [DRAFT_VOCAB] * 4
    assert found["logit_error"] < 1e-3  # fp16 checkpoint, fp32 engine
    assert found["fc_error"] < 1e-3


def test_greedy_output_is_identical_to_target_only(runs):
    for name in ("greedy", "single"):
        assert ids(runs["eagle3"], name) == ids(runs["none"], name), name
    assert all(len(tokens) == 32 for tokens in ids(runs["eagle3"], "greedy"))


def test_drafts_are_proposed_and_verification_chooses(runs):
    result = runs["eagle3"]
    counters = phase(result, "greedy")["counters"]
    assert counters["vllm:spec_decode_num_drafts"] > 0, "nothing was drafted"
    accepted, drafted = counters["vllm:spec_decode_num_accepted_tokens"], counters["vllm:spec_decode_num_draft_tokens"]
    assert 0 < accepted < drafted, counters
    # The head drafts right only if fc saw the aux hidden state of layer L-3 (the last of the config's
    # layers) and its lm_head rows were mapped back through d2t: acceptance proves both.
    assert counters["accepted_per_position"][0] > 0, counters
    # through vspec's adaptive scheduler: K changed between steps (the sweep, through K=0)
    assert "vspec active: method=eagle3" in result["stderr"]
    assert len({line["gamma"] for line in result["trace"]}) > 1, "K never changed"
    assert {int(k) for k in phase(result, "greedy")["selections"]} >= {0, 2, 3}


def test_sampled_requests_follow_the_target_distribution(runs):
    spec_outputs, reference = phase(runs["eagle3"], "sampled")["outputs"], phase(runs["none"], "sampled")["outputs"]
    assert phase(runs["eagle3"], "sampled")["counters"]["vllm:spec_decode_num_drafts"] > 0
    problems = distribution_problems(spec_outputs, reference)
    assert not problems, problems


def test_greedy_rows_batched_with_sampled_ones_stay_identical(runs):
    mixed = phase(runs["eagle3"], "mixed")
    assert mixed["counters"]["vllm:spec_decode_num_drafts"] > 0, "nothing was drafted in the mixed batch"
    greedy_rows = [out["token_ids"] for out in mixed["outputs"][0::2]]
    assert greedy_rows == [out["token_ids"] for out in phase(runs["none"], "mixed")["outputs"][0::2]]
    assert all(len(out["token_ids"]) == 24 for out in mixed["outputs"])
    alone = ids(runs["none"], "greedy")
    assert greedy_rows == [tokens[:24] for tokens in alone]
