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


def eagle3_aux_layer_ids(layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers for a target with ``layers`` decoder layers (SupportsEagle3:
    ``get_eagle3_default_aux_hidden_state_layers``): the residual stream after that many layers."""
    return [2, layers // 2, layers - 3]


def build_llama_for_eagle3(target: Path, tokenizer_dir: Path, seed: int, vocab_size: int, layers: int = 8,
                           hidden: int = 128, logit_scale: float = 20.0) -> Path:
    """A random, sharpened Llama target for EAGLE-3 heads: enough layers for vLLM's three default aux
    layers (2, L//2, L-3) to be distinct, and its last three layers made identities (o_proj and
    down_proj zero), so the residual stream after layer L-3 -- the last aux hidden state -- is the
    final pre-norm hidden state. A head can then draft from the target's own prediction without any
    training (see ``build_llama_eagle3_head``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**_common(vocab_size, hidden, layers), bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
        for layer in model.model.layers[layers - 3:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return _save(model, target, tokenizer_dir)


def frequent_token_ids(target_model: Path, count: int, seed: int = 0, contexts: int = 64, length: int = 48) -> list[int]:
    """The ``count`` token ids the target predicts most often (argmax) over random contexts and its own
    greedy continuations -- how a trainer picks a reduced draft vocabulary, on a random model."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target_model, torch_dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    counts = torch.zeros(vocab, dtype=torch.long)
    with torch.no_grad():
        prompts = torch.randint(3, vocab, (contexts, 8), generator=generator)
        greedy = model.generate(prompts, max_new_tokens=length, do_sample=False, pad_token_id=0,
                                attention_mask=torch.ones_like(prompts))
        predicted = model(torch.randint(3, vocab, (contexts, length), generator=generator)).logits.argmax(-1)
        counts += torch.bincount(greedy[:, 8:].flatten(), minlength=vocab)
        counts += torch.bincount(predicted.flatten(), minlength=vocab)
    seen = [int(i) for i in torch.argsort(counts, descending=True, stable=True) if counts[i] > 0]
    return seen[:count]


def build_llama_eagle3_head(target: Path, target_model: Path, seed: int, draft_vocab: int = 2048,
                            draft_ids=None, aux_layer_ids=None, informative: bool = True) -> Path:
    """An EAGLE-3 head with a REDUCED draft vocabulary for a Llama target, in the layout the EAGLE-3
    trainer exports and vLLM's ``Eagle3LlamaForCausalLM`` loads (fp16 safetensors):

      fc.weight (H, 3H) over cat[aux hidden states at ``aux_layer_ids``, default (2, L//2, L-3)];
      layers.0.{input_layernorm, hidden_norm, post_attention_layernorm}.weight (H);
      layers.0.self_attn.{q,k,v}_proj (.., 2H) over cat[input_norm(embed), hidden_norm(fc(aux))], o_proj;
      layers.0.mlp.{gate,up,down}_proj; norm.weight; lm_head.weight (N, H);
      d2t (N,) int64 with target_id = i + d2t[i]; t2d (vocab,) bool; no embed_tokens (the target's).

    The draft vocabulary is ``draft_ids`` (target ids) or the target's ``draft_vocab`` most frequent
    predictions topped up with the first ids, always with eos; it is stored sorted, as trainers do.

    ``informative``: random q/k/v/gate/up, but fc copies the last aux hidden state (chunk 3), o_proj
    and down_proj are small, norm.weight is the target's and lm_head the target's rows for the draft
    vocabulary. On a target from ``build_llama_for_eagle3`` (last aux = final hidden state) the head
    then drafts about what the target predicted one position earlier ("repeat the last token" in
    the draft vocabulary): right whenever the target repeats, wrong otherwise -- verification really
    chooses, with no training. Otherwise every weight is random.
    """
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((target_model / "config.json").read_text())
    config.pop("transformers_version", None)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    aux = list(aux_layer_ids or eagle3_aux_layer_ids(layers))
    eos = config.get("eos_token_id", 2)
    eos_ids = eos if isinstance(eos, list) else [eos]

    if draft_ids is None:
        chosen = list(dict.fromkeys([*eos_ids, *frequent_token_ids(target_model, draft_vocab, seed=seed)]))
        chosen += [i for i in range(vocab) if i not in set(chosen)][: max(0, draft_vocab - len(chosen))]
        draft_ids = chosen[:draft_vocab]
        if not set(eos_ids) <= set(draft_ids):
            draft_ids = [*eos_ids, *draft_ids[len(eos_ids):]]
    ids = torch.tensor(sorted(set(int(i) for i in draft_ids)), dtype=torch.long)
    n = len(ids)
    d2t = ids - torch.arange(n)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True

    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape, std=0.02: torch.randn(*shape, generator=generator) * std  # noqa: E731
    tensors = {
        "layers.0.input_layernorm.weight": torch.ones(hidden),
        "layers.0.hidden_norm.weight": torch.ones(hidden),
        "layers.0.post_attention_layernorm.weight": torch.ones(hidden),
        "layers.0.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "layers.0.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "layers.0.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "layers.0.mlp.gate_proj.weight": rand(inter, hidden),
        "layers.0.mlp.up_proj.weight": rand(inter, hidden),
    }
    if informative:
        weights = load_file(str(target_model / "model.safetensors"))
        fc = torch.zeros(hidden, len(aux) * hidden)
        fc[:, (len(aux) - 1) * hidden:] = torch.eye(hidden)
        tensors.update({
            "fc.weight": fc,
            "layers.0.self_attn.o_proj.weight": rand(hidden, heads * head_dim, std=1e-4),
            "layers.0.mlp.down_proj.weight": rand(hidden, inter, std=1e-4),
            "norm.weight": weights["model.norm.weight"].float().clone(),
            "lm_head.weight": weights["lm_head.weight"].float()[ids].clone(),
        })
    else:
        tensors.update({
            "fc.weight": rand(hidden, len(aux) * hidden),
            "layers.0.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            "layers.0.mlp.down_proj.weight": rand(hidden, inter),
            "norm.weight": torch.ones(hidden),
            "lm_head.weight": rand(n, hidden),
        })
    tensors = {name: tensor.to(torch.float16).contiguous() for name, tensor in tensors.items()}
    tensors["d2t"], tensors["t2d"] = d2t, t2d

    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], draft_vocab_size=n,
                  target_hidden_size=hidden, tie_word_embeddings=False, torch_dtype="float16",
                  eagle_config={"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True})
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"))
    # config.json last: its presence marks the head as complete for the cache check.
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target
