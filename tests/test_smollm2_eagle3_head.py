"""The EAGLE-3 head that ships with vspec (drafters/smollm2-eagle3) is the file the GPU pipeline trained.

Shapes and names are what vLLM's `Eagle3LlamaForCausalLM` loads (tests/test_eagle3_reduced_vocab.py and
tests/test_gpu_pipeline.py check that loader on tiny heads), the d2t map points into the demo's
vocabulary, the manifest records data, tokens, steps, losses and vocabulary, and one chained forward
through the trainer's head (training/eagle3.py) gives the golden values recorded when it shipped. A
corrupted, truncated or wrongly converted file fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "training"))

from eagle3 import load_exported  # noqa: E402

HEAD = REPO / "drafters" / "smollm2-eagle3"
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB, DRAFT_VOCAB = 576, 1536, 9, 3, 64, 49152, 8192
EXPECTED_SHAPES = {
    "fc.weight": (HIDDEN, 3 * HIDDEN),
    "layers.0.input_layernorm.weight": (HIDDEN,),
    "layers.0.hidden_norm.weight": (HIDDEN,),
    "layers.0.self_attn.q_proj.weight": (HEADS * HEAD_DIM, 2 * HIDDEN),
    "layers.0.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
    "layers.0.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, 2 * HIDDEN),
    "layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    "layers.0.post_attention_layernorm.weight": (HIDDEN,),
    "layers.0.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.0.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    "layers.0.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    "norm.weight": (HIDDEN,),
    "lm_head.weight": (DRAFT_VOCAB, HIDDEN),
    "d2t": (DRAFT_VOCAB,),
    "t2d": (VOCAB,),
}
# Recorded from the checked-in file by golden_output() below; fp32 arithmetic on fp16 weights.
GOLDEN_TARGET_IDS = [19885, 281, 284]
GOLDEN_LOGIT_ABS_MEAN = 4.8277


def load_tensors() -> dict:
    from safetensors.torch import load_file

    return load_file(str(HEAD / "model.safetensors"))


def target_config() -> dict:
    config = json.loads((HEAD / "config.json").read_text())
    config = dict(config, num_hidden_layers=30, _rope_theta=config["rope_parameters"]["rope_theta"])
    return config


def test_head_files_are_complete_and_the_manifest_says_how_it_was_made():
    assert (HEAD / "model.safetensors").stat().st_size < 24 * 1024 * 1024
    config = json.loads((HEAD / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (HIDDEN, 1, VOCAB)
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's default for 30 layers
    manifest = json.loads((HEAD / "manifest.json").read_text())
    assert manifest["target_sha256"] == manifest["target_sha256_expected"]  # trained on the exact demo target
    assert manifest["data"]["generated_train_tokens"] > 1_000_000
    assert manifest["vocabulary"]["size"] == DRAFT_VOCAB and manifest["vocabulary"]["coverage_of_target_tokens"] > 0.95
    assert manifest["training"]["steps"] > 0 and manifest["training"]["train_loss_log"]["rows"]
    curve = manifest["learning_curve"]
    assert curve[-1]["positions_seen"] > curve[0]["positions_seen"]


def test_head_tensors_have_the_eagle3_llama_layout():
    tensors = load_tensors()
    assert {name: tuple(t.shape) for name, t in tensors.items()} == EXPECTED_SHAPES
    assert all(t.dtype == torch.float16 for n, t in tensors.items() if n not in ("d2t", "t2d"))
    assert all(torch.isfinite(t).all() for n, t in tensors.items() if n not in ("d2t", "t2d"))
    draft_ids = torch.arange(DRAFT_VOCAB) + tensors["d2t"]
    assert bool((draft_ids[1:] > draft_ids[:-1]).all()) and 0 <= int(draft_ids[0]) and int(draft_ids[-1]) < VOCAB
    assert 2 in draft_ids.tolist()  # <|im_end|>, the demo's end of turn, can be drafted
    assert bool(tensors["t2d"][draft_ids].all()) and int(tensors["t2d"].sum()) == DRAFT_VOCAB


def golden_output() -> tuple[list[int], float]:
    """Target ids drafted by steps 1-3 at the last position, for fixed seed-free inputs."""
    head = load_exported(HEAD, target_config())
    steps = 8
    grid = torch.arange(steps * 3 * HIDDEN, dtype=torch.float32).view(1, steps, 3 * HIDDEN)
    aux = 3.0 * torch.cos(grid * 0.11)
    embeds = 0.05 * torch.sin(grid[..., :HIDDEN] * 0.37)
    with torch.no_grad():
        outputs = head.rollout(embeds, aux, 3)
        logits = [head.logits(out[0, -1]) for out in outputs]
    ids = [int(head.draft_to_target[l.argmax()]) for l in logits]
    return ids, round(float(torch.stack(logits).abs().mean()), 4)


def test_one_chained_forward_gives_the_recorded_values():
    ids, abs_mean = golden_output()
    assert ids == GOLDEN_TARGET_IDS
    assert abs_mean == pytest.approx(GOLDEN_LOGIT_ABS_MEAN, abs=1e-3)
