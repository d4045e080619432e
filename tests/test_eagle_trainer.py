"""The EAGLE trainer's head (training/head.py) computes what vLLM's eagle model will run.

vLLM's `EagleLlamaForCausalLM` chains `num_hidden_layers` Llama decoder layers after the fc, layer 0 without
an input norm and no final norm. If the trainer's step-1 forward drifted from that, a head would train well
and then draft garbage in vLLM; here a random two-layer head is run both ways and must agree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from head import EagleHead, checkpoint_tensors, load_head  # noqa: E402

CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "rms_norm_eps": 1e-5, "_rope_theta": 10000.0, "vocab_size": 32, "max_position_embeddings": 64}


def random_head(layers: int) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead(CONFIG, layers=layers)
    with torch.no_grad():
        for parameter in head.parameters():
            value = 1.0 + 0.2 * torch.randn_like(parameter) if parameter.dim() == 1 else 0.1 * torch.randn_like(parameter)
            parameter.copy_(value.half().float())  # exactly representable in the fp16 export
    return head


def transformers_forward(tensors: dict, layers: int, x):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if not k.startswith("_")}, rope_theta=10000.0)
    steps = x.shape[1]
    positions = torch.arange(steps)[None]
    mask = torch.full((steps, steps), float("-inf")).triu(1)[None, None]
    for index in range(layers):
        layer = LlamaDecoderLayer(config, layer_idx=index)
        state = {k.removeprefix(f"layers.{index}."): v for k, v in tensors.items() if k.startswith(f"layers.{index}.")}
        if index == 0:
            state["input_layernorm.weight"] = torch.ones(CONFIG["hidden_size"])
        layer.load_state_dict(state)
        if index == 0:
            layer.input_layernorm = torch.nn.Identity()  # vLLM: the fc output goes into layer 0 as is
        out = layer(x, attention_mask=mask, position_ids=positions,
                    position_embeddings=LlamaRotaryEmbedding(config)(x, positions))
        x = out[0] if isinstance(out, tuple) else out
    return x


@pytest.mark.parametrize("layers", [1, 2])
def test_first_draft_step_matches_transformers_llama_layers(layers):
    head = random_head(layers)
    hidden = CONFIG["hidden_size"]
    embeds, features = 0.1 * torch.randn(1, 8, hidden), torch.randn(1, 8, hidden)
    tensors = {name: tensor.float() for name, tensor in checkpoint_tensors(head).items()}
    with torch.no_grad():
        ours = head.rollout(embeds, features, 1)[0]
        x = torch.nn.functional.linear(torch.cat((embeds, features), -1), tensors["fc.weight"])
        theirs = transformers_forward(tensors, layers, x)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


def test_export_names_follow_vllm_and_layer_zero_has_no_input_norm():
    names = set(checkpoint_tensors(random_head(2)))
    assert "layers.1.input_layernorm.weight" in names and "layers.0.input_layernorm.weight" not in names
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight"} <= names


def test_head_saved_before_multi_layer_heads_still_loads(tmp_path):
    head = random_head(1)
    legacy = {name.removeprefix("layers.0."): tensor for name, tensor in head.state_dict().items()}
    torch.save(legacy, tmp_path / "head.pt")
    loaded = load_head(tmp_path / "head.pt", CONFIG)
    assert len(loaded.layers) == 1
    assert torch.equal(loaded.layers[0].q_proj.weight, head.layers[0].q_proj.weight)
