"""The EAGLE head that ships with vspec (drafters/smollm2-eagle) is the file we trained.

Shapes and names are what vLLM's Llama EAGLE-1 loader expects, and one forward pass through it
(transformers' Llama decoder layer, as vLLM's eagle model runs it: fc over cat[embedding, hidden],
no input norm, no final norm) gives the golden values recorded when it was trained. A corrupted,
truncated or wrongly converted file fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vspec_cli import model_store

HEAD = Path(__file__).resolve().parents[1] / "drafters" / "smollm2-eagle"
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64
EXPECTED_SHAPES = {
    "fc.weight": (HIDDEN, 2 * HIDDEN),
    "layers.0.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    "layers.0.post_attention_layernorm.weight": (HIDDEN,),
    "layers.0.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.0.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.0.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
}
# Recorded from the checked-in file (see golden_output below); fp32 arithmetic, so 1e-3 is plenty.
GOLDEN_LAST_POSITION_FIRST4 = [-0.85022, -1.92122, 1.9879, -0.19752]
GOLDEN_ABS_MEAN = 1.59012


def load_tensors() -> dict:
    from safetensors.torch import load_file

    return load_file(str(HEAD / "model.safetensors"))


def test_head_files_are_complete_and_small():
    assert (HEAD / "model.safetensors").stat().st_size < 20 * 1024 * 1024
    manifest = json.loads((HEAD / "manifest.json").read_text())
    assert manifest["seed"] is not None and manifest["training"]["best_val"]["acceptance_estimate"] > 1.0
    config = json.loads((HEAD / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (HIDDEN, 1, 49152)
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_head_tensors_have_the_eagle_llama_layout():
    import torch

    tensors = load_tensors()
    assert {name: tuple(t.shape) for name, t in tensors.items()} == EXPECTED_SHAPES
    assert all(t.dtype == torch.float16 for t in tensors.values())
    assert all(torch.isfinite(t).all() for t in tensors.values())


def golden_output():
    """The head's step-1 output for fixed, seed-free inputs, through transformers' decoder layer."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    tensors = {k: v.float() for k, v in load_tensors().items()}
    config = LlamaConfig(**{k: v for k, v in json.loads((HEAD / "config.json").read_text()).items()
                            if k not in ("transformers_version", "torch_dtype", "architectures")})
    layer = LlamaDecoderLayer(config, layer_idx=0)
    state = {k.removeprefix("layers.0."): v for k, v in tensors.items() if k.startswith("layers.0.")}
    state["input_layernorm.weight"] = torch.ones(HIDDEN)
    layer.load_state_dict(state)
    layer.input_layernorm = torch.nn.Identity()  # EAGLE-1: no input norm on the head's layer
    steps = 8
    grid = torch.arange(steps * HIDDEN, dtype=torch.float32).view(1, steps, HIDDEN)
    embeds, features = 0.05 * torch.sin(grid * 0.37), 2.0 * torch.cos(grid * 0.11)
    with torch.no_grad():
        x = torch.nn.functional.linear(torch.cat((embeds, features), -1), tensors["fc.weight"])
        positions = torch.arange(steps)[None]
        mask = torch.full((steps, steps), float("-inf")).triu(1)[None, None]
        out = layer(x, attention_mask=mask, position_ids=positions,
                    position_embeddings=LlamaRotaryEmbedding(config)(x, positions))
    return out[0] if isinstance(out, tuple) else out


def test_head_forward_matches_the_golden_values():
    import torch

    out = golden_output()
    assert out.shape == (1, 8, HIDDEN)
    assert torch.allclose(out[0, -1, :4], torch.tensor(GOLDEN_LAST_POSITION_FIRST4), atol=1e-3), out[0, -1, :4]
    assert abs(out.abs().mean().item() - GOLDEN_ABS_MEAN) < 1e-3, out.abs().mean().item()


def test_vspec_models_knows_the_head_without_preparing_it(isolated_home):
    resolved = model_store.resolve("smollm2-eagle")
    assert resolved.source == "packaged" and resolved.path == HEAD.resolve()
    report = model_store.report("smollm2-eagle")
    assert (report.role, report.status, report.revision) == ("eagle", "ok", "ships with vspec")


if __name__ == "__main__":  # print the golden values after training a new head
    result = golden_output()
    print("GOLDEN_LAST_POSITION_FIRST4 =", [round(v, 5) for v in result[0, -1, :4].tolist()])
    print("GOLDEN_ABS_MEAN =", round(result.abs().mean().item(), 5))
