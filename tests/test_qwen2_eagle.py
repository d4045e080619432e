"""Qwen2 EAGLE-1 heads (``Qwen2ForCausalLMEagle``), registered by vspec since vLLM 0.32 dropped them.

A tiny random Qwen2 target plus a tiny random head built here, with and without QKV biases, load
and serve on vLLM CPU with ``method=eagle``; greedy output is identical to target-only (fp32).
The weight-loading test goes through vLLM's real model loader and checks the biases themselves.
"""

from __future__ import annotations

import json

import pytest

import draft_loader
from conftest import CACHE, QWEN2_MAX_TOKENS, qwen2_request, qwen2_spec, run_offline

from vspec_runtime.models import QWEN2_EAGLE_ARCHITECTURES, QWEN2_EAGLE_CLASS, register_models

NO_QKV_BIAS_LOG = "has no QKV biases"


@pytest.fixture(scope="module")
def heads(tiny_models):
    """The same random head twice: once as shipped (the session's ``tiny_models["qwen2-eagle"]``), once
    converted without q/k/v and fc biases."""
    import tiny_models as tm

    path = CACHE / "tiny" / "qwen2-eagle-nobias"
    if not (path / "config.json").exists():
        tm.build_qwen2_eagle_head(path, tiny_models["qwen2"], seed=5, qkv_bias=False, fc_bias=False)
    return {"qwen2-eagle": tiny_models["qwen2-eagle"], "qwen2-eagle-nobias": path}


# --- registration ------------------------------------------------------------------------------


def test_the_architectures_vllm_resolves_are_registered_lazily_and_once():
    from vllm import ModelRegistry

    register_models()
    assert register_models() == (), "a second registration must do nothing"
    for architecture in QWEN2_EAGLE_ARCHITECTURES:
        model = ModelRegistry.models[architecture]
        assert f"{model.module_name}:{model.class_name}" == QWEN2_EAGLE_CLASS
    assert "Qwen2ForCausalLM" not in QWEN2_EAGLE_ARCHITECTURES  # the target keeps vLLM's class


@pytest.mark.parametrize("declared", ["Qwen2ForCausalLMEagle", "Qwen2ForCausalLM", "EagleQwen2ForCausalLM"])
def test_every_name_vllm_gives_a_qwen2_head_under_method_eagle_is_covered(declared):
    """vLLM renames a head's architecture X to "Eagle"+X unless it starts with "Eagle"."""
    from transformers import Qwen2Config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    renamed = EAGLEConfig(Qwen2Config(architectures=[declared]), method="eagle").architectures
    assert set(renamed) <= set(QWEN2_EAGLE_ARCHITECTURES)
    if declared != "Qwen2ForCausalLM":
        assert declared in QWEN2_EAGLE_ARCHITECTURES  # the draft ModelConfig resolves it first


def test_an_architecture_vllm_already_has_is_left_alone(monkeypatch):
    from vllm import ModelRegistry

    upstream = object()
    monkeypatch.setitem(ModelRegistry.models, "Qwen2ForCausalLMEagle", upstream)
    register_models()
    assert ModelRegistry.models["Qwen2ForCausalLMEagle"] is upstream


# --- weights, through vLLM's loader ------------------------------------------------------------

LOADER_PROBE = r"""
# vLLM's CPU backend may repack linear weights after loading: compare what the layers compute.
layer, fc = model.model.layers[0], model.model.fc
hidden = fc.input_size
zeros, probe = torch.zeros(1, hidden), torch.randn(3, hidden, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    qkv_bias = layer.self_attn.qkv_proj(torch.zeros(1, hidden // 2))[0][0]
    fc_bias = fc(zeros)[0]
    fc_linear = fc(probe) - fc_bias
names = [f"layers.0.self_attn.{p}_proj.bias" for p in "qkv"]
print("RESULT=" + json.dumps({
    "class": type(model).__name__,
    "qkv_bias": qkv_bias.tolist(),
    "qkv_expected": torch.cat([checkpoint[n] for n in names]).tolist() if names[0] in checkpoint else None,
    "fc_bias": fc_bias.tolist(),
    "fc_expected": checkpoint["fc.bias"].tolist() if "fc.bias" in checkpoint else None,
    "fc_weight_error": (fc_linear - probe @ checkpoint["fc.weight"].T).abs().max().item(),
    "input_norm": type(layer.input_layernorm).__name__,
}))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["qwen2-eagle", "qwen2-eagle-nobias"])
def test_vllm_loader_gives_checkpoint_biases_or_zeros(tiny_models, heads, name, tmp_path):
    found, stderr = draft_loader.probe(tiny_models["qwen2"], heads[name], "eagle", LOADER_PROBE)
    assert found["class"] == "EagleQwen2ForCausalLM" and found["input_norm"] == "Identity"
    assert found["fc_weight_error"] < 1e-5, "fc does not compute with the checkpoint's weight"
    if name == "qwen2-eagle":
        assert found["qkv_bias"] == pytest.approx(found["qkv_expected"])
        assert found["fc_bias"] == pytest.approx(found["fc_expected"])
        assert NO_QKV_BIAS_LOG not in stderr
    else:
        assert found["qkv_expected"] is None and set(found["qkv_bias"]) == {0.0}
        assert set(found["fc_bias"]) == {0.0}
        assert stderr.count(NO_QKV_BIAS_LOG) == 1, "the missing biases are logged exactly once"


# --- serving -----------------------------------------------------------------------------------


def generate(tmp_path, spec_: dict, target: str, drafter: str | None = None) -> dict:
    return run_offline(qwen2_request(spec_, target, drafter), tmp_path)


def token_ids(result: dict) -> list[list[int]]:
    return [out["token_ids"] for phase in result["phases"] for out in phase["outputs"]]


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["qwen2-eagle", "qwen2-eagle-nobias"])
def test_qwen2_eagle_head_serves_with_output_identical_to_target_only(tiny_models, heads, qwen2_runs, tmp_path, name):
    target, head = str(tiny_models["qwen2"]), str(heads[name])
    assert json.loads((heads[name] / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLMEagle"]
    # The head with biases is the session's shared run (the relaxed-acceptance test reads it too).
    result = qwen2_runs("eagle") if name == "qwen2-eagle" else generate(tmp_path, qwen2_spec("eagle", target, head),
                                                                          target, head)

    assert token_ids(result) == token_ids(qwen2_runs("target-only"))
    assert all(len(ids) == QWEN2_MAX_TOKENS for ids in token_ids(result))
    assert result["counters"]["vllm:spec_decode_num_drafts"] > 0, "nothing was drafted"
    assert "loaded a Qwen2 EAGLE-1 head (1 layer(s)) as EagleQwen2ForCausalLM" in result["stderr"]
    assert (NO_QKV_BIAS_LOG in result["stderr"]) == (name == "qwen2-eagle-nobias")
