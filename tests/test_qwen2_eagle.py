"""Qwen2 EAGLE-1 heads (``Qwen2ForCausalLMEagle``), registered by vspec since vLLM 0.32 dropped them.

A tiny random Qwen2 target plus a tiny random head built here, with and without QKV biases, load
and serve on vLLM CPU with ``method=eagle``; greedy output is identical to target-only (fp32).
The weight-loading test goes through vLLM's real model loader and checks the biases themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import CACHE, REPO, run_offline

from vspec_runtime.models import QWEN2_EAGLE_ARCHITECTURES, QWEN2_EAGLE_CLASS, register_models

PROMPTS = [
    "one two three one two three one two three one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
]
MAX_TOKENS = 32
NO_QKV_BIAS_LOG = "has no QKV biases"


@pytest.fixture(scope="module")
def heads(tiny_models):
    """The same random head twice: once as shipped, once converted without q/k/v and fc biases."""
    import tiny_models as tm

    built = {}
    for name, biases in (("qwen2-eagle", True), ("qwen2-eagle-nobias", False)):
        path = CACHE / "tiny" / name
        if not (path / "config.json").exists():
            tm.build_qwen2_eagle_head(path, tiny_models["qwen2"], seed=5, qkv_bias=biases, fc_bias=biases)
        built[name] = path
    return built


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

LOAD_SCRIPT = r"""
import json, os, sys
target, head = sys.argv[1], sys.argv[2]
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["VSPEC_SPEC"] = json.dumps({"method": "eagle", "target_model": target, "drafter": head})
import torch
torch.accelerator.empty_cache = lambda: None  # as vLLM's CPU worker does: no accelerator here
from safetensors.torch import load_file
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model
config = EngineArgs(model=target, dtype="float32", max_model_len=256, enforce_eager=True,
                    speculative_config={"method": "eagle", "model": head, "num_speculative_tokens": 2}
                    ).create_engine_config()
with set_current_vllm_config(config):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="tcp://127.0.0.1:" + sys.argv[3])
    initialize_model_parallel(1, 1)
    model = get_model(vllm_config=config, model_config=config.speculative_config.draft_model_config)
checkpoint = load_file(os.path.join(head, "model.safetensors"))
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
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k != "VSPEC_SPEC"}
    proc = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tiny_models["qwen2"]), str(heads[name]), port],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT=")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    found = json.loads(lines[0].removeprefix("RESULT="))
    assert found["class"] == "EagleQwen2ForCausalLM" and found["input_norm"] == "Identity"
    assert found["fc_weight_error"] < 1e-5, "fc does not compute with the checkpoint's weight"
    if name == "qwen2-eagle":
        assert found["qkv_bias"] == pytest.approx(found["qkv_expected"])
        assert found["fc_bias"] == pytest.approx(found["fc_expected"])
        assert NO_QKV_BIAS_LOG not in proc.stderr
    else:
        assert found["qkv_expected"] is None and set(found["qkv_bias"]) == {0.0}
        assert set(found["fc_bias"]) == {0.0}
        assert proc.stderr.count(NO_QKV_BIAS_LOG) == 1, "the missing biases are logged exactly once"


# --- serving -----------------------------------------------------------------------------------


def generate(tmp_path, spec: dict, target: str, drafter: str | None = None) -> dict:
    request = {"spec": spec, "target_path": target, "drafter_path": drafter, "chat": False,
               "engine_overrides": {"enforce_eager": True},
               "phases": [{"name": "batch", "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "ignore_eos": True},
                          {"name": "single", "prompts": PROMPTS[:1], "max_tokens": MAX_TOKENS, "ignore_eos": True}]}
    return run_offline(request, tmp_path)


def spec(method: str, target: str, drafter: str | None = None) -> dict:
    return {"method": method, "target_model": target, "drafter": drafter, "gamma": 3,
            "serving": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 8, "device": "cpu"}}


def token_ids(result: dict) -> list[list[int]]:
    return [out["token_ids"] for phase in result["phases"] for out in phase["outputs"]]


@pytest.fixture(scope="module")
def target_only(tiny_models, tmp_path_factory):
    target = str(tiny_models["qwen2"])
    return generate(tmp_path_factory.mktemp("qwen2-target-only"), spec("none", target), target)


@pytest.mark.vllm
@pytest.mark.parametrize("name", ["qwen2-eagle", "qwen2-eagle-nobias"])
def test_qwen2_eagle_head_serves_with_output_identical_to_target_only(tiny_models, heads, target_only, tmp_path, name):
    target, head = str(tiny_models["qwen2"]), str(heads[name])
    assert json.loads((heads[name] / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLMEagle"]
    result = generate(tmp_path, spec("eagle", target, head), target, head)

    assert token_ids(result) == token_ids(target_only)
    assert all(len(ids) == MAX_TOKENS for ids in token_ids(result))
    assert result["counters"]["vllm:spec_decode_num_drafts"] > 0, "nothing was drafted"
    assert "loaded a Qwen2 EAGLE-1 head (1 layer(s)) as EagleQwen2ForCausalLM" in result["stderr"]
    assert (NO_QKV_BIAS_LOG in result["stderr"]) == (name == "qwen2-eagle-nobias")
