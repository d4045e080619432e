"""Tiny random models built on the fly (seconds), sharing the demo model's tokenizer.

They prove plumbing and losslessness, not speed: random weights, fp32, 2 layers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def _copy_tokenizer(tokenizer_dir: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, target / name)


def _save(model, target: Path, tokenizer_dir: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    _copy_tokenizer(tokenizer_dir, target)
    return target


def _common(vocab_size: int, hidden: int, layers: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,  # head_dim 64: vLLM's CPU attention supports only some head sizes
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def build_llama(target: Path, tokenizer_dir: Path, seed: int, vocab_size: int, layers: int = 2, hidden: int = 128,
                logit_scale: float = 1.0) -> Path:
    """A random Llama. Its next-token distribution is nearly uniform over the whole vocabulary unless
    ``logit_scale`` sharpens it: at 20 a few tokens carry most of the mass (entropy of a few nats), so a
    sampled-output test over a few hundred seeds can tell one distribution from another."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**_common(vocab_size, hidden, layers), bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return _save(model, target, tokenizer_dir)


def write_llama_config(target: Path, vocab_size: int = 1024) -> Path:
    """Only the config.json of a tiny Llama: enough for vLLM's ModelConfig and scheduler tests, which
    never load weights or a tokenizer (build it with ``skip_tokenizer_init=True``)."""
    from transformers import LlamaConfig

    target.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**_common(vocab_size, hidden=128, layers=2), bos_token_id=1, eos_token_id=2)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(target)
    return target


def build_qwen2(target: Path, tokenizer_dir: Path, seed: int, vocab_size: int, layers: int = 2, hidden: int = 128) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**_common(vocab_size, hidden, layers), bos_token_id=1, eos_token_id=2)
    return _save(Qwen2ForCausalLM(config).float(), target, tokenizer_dir)


def build_llama_eagle_head(target: Path, target_model: Path, seed: int) -> Path:
    """An EAGLE-1 head for a Llama target in the layout vLLM's eagle method loads.

    fc: Linear(2*hidden -> hidden) over cat[embed(next token), target hidden]; one decoder layer
    named layers.0.*; no embedding or lm_head (shared with the target).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config_dict = json.loads((target_model / "config.json").read_text())
    config_dict.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    config = LlamaConfig(**{k: v for k, v in config_dict.items() if k not in ("transformers_version",)})
    torch.manual_seed(seed)
    hidden = config.hidden_size
    layer = LlamaDecoderLayer(config, layer_idx=0)
    tensors = {"fc.weight": torch.randn(hidden, 2 * hidden) * 0.02}
    for name, tensor in layer.state_dict().items():
        if "input_layernorm" in name:
            continue  # EAGLE-1 has no input norm on its layer
        tensors[f"layers.0.{name}"] = tensor.detach().clone().contiguous().float()
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    config.save_pretrained(target)
    return target


def build_qwen2_eagle_head(target: Path, target_model: Path, seed: int, qkv_bias: bool = True,
                           fc_bias: bool = True) -> Path:
    """An EAGLE-1 head for a Qwen2 target, as the reference plugin's users ship them.

    Architecture ``Qwen2ForCausalLMEagle`` (vLLM 0.32 has no such model; vspec registers it).
    Same layout as the Llama head (fc over cat[embed, hidden], one layer ``layers.0.*`` without an
    input norm, embedding and LM head shared with the target) plus Qwen2's q/k/v biases and the
    original EAGLE fc bias. ``qkv_bias=False`` drops the q/k/v biases from the checkpoint, as some
    converted heads do; vspec must then use zero biases. The biases are made large enough that
    loading them (or not) changes the drafts.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    config_dict = json.loads((target_model / "config.json").read_text())
    config_dict.update(num_hidden_layers=1, architectures=["Qwen2ForCausalLMEagle"])
    config_dict.pop("layer_types", None)
    config = Qwen2Config(**{k: v for k, v in config_dict.items() if k not in ("transformers_version",)})
    torch.manual_seed(seed)
    hidden = config.hidden_size
    layer = Qwen2DecoderLayer(config, layer_idx=0)
    tensors = {"fc.weight": torch.randn(hidden, 2 * hidden) * 0.02}
    if fc_bias:
        tensors["fc.bias"] = torch.randn(hidden) * 0.02
    for name, tensor in layer.state_dict().items():
        if "input_layernorm" in name:
            continue  # EAGLE-1 has no input norm on its layer
        if name.endswith("_proj.bias") and "self_attn" in name:
            if not qkv_bias:
                continue
            tensor = torch.randn_like(tensor) * 0.5
        tensors[f"layers.0.{name}"] = tensor.detach().clone().contiguous().float()
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    config.save_pretrained(target)
    return target


def build_truncated_copy(target: Path, source: Path, layers: int) -> Path:
    """The first `layers` decoder layers of `source` as a draft model: cheap, but wrong most of the time."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = layers
    tensors = load_file(str(source / "model.safetensors"))
    kept = {name: tensor for name, tensor in tensors.items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers}
    save_file(kept, str(target / "model.safetensors"))
    _copy_tokenizer(source, target)
    if (source / "generation_config.json").exists():
        shutil.copy(source / "generation_config.json", target / "generation_config.json")
    # config.json last: its presence marks the model as complete for the cache check.
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target
