"""The EAGLE-3 head with a reduced draft vocabulary: its forward, initialisation and export.

This is what vLLM's `Eagle3LlamaForCausalLM` runs (vllm/model_executor/models/llama_eagle3.py):

    h = fc(cat[aux_a, aux_b, aux_c])                  # step 1: the target's residual stream after
                                                      # layers (2, L//2, L-3); later steps: the
                                                      # head's own pre-norm output one position back
    x = cat[input_layernorm(embed(token i+1)), hidden_norm(h)]    # 2H into q, k and v
    h2 = h + o_proj(attention(x))                     # the residual is h, not x
    pre = h2 + mlp(post_attention_layernorm(h2))      # what the next draft step reads
    logits_draft = lm_head(norm(pre))                 # N draft-vocabulary logits
    target id of draft id d = d + d2t[d]              # vLLM scatters them into the full vocabulary

Why this layout for the CPU demo: the EAGLE-1 head shares the target's 49,152-word LM head, which
is most of a draft pass's cost on a 576-wide model. A draft vocabulary of a few thousand tokens,
chosen from what the target actually says, keeps almost every target choice reachable at a fraction
of the cost (the training pipeline measures the share covered).

The attention pattern during training is the one vLLM's KV cache has while drafting (training-time
test, see head.py): step-1 keys over the context, then one key per later step.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from head import _shift_right, chained_attention, project_qkv


def aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers (SupportsEagle3.get_eagle3_default_aux_hidden_state_layers):
    index i is the residual stream after i target layers."""
    return [2, num_layers // 2, num_layers - 3]


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Eagle3Head(nn.Module):
    def __init__(self, config: dict, draft_vocab: int):
        super().__init__()
        hidden, inter = config["hidden_size"], config["intermediate_size"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or hidden // self.heads
        self.eps = config["rms_norm_eps"]
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(hidden))
        self.hidden_norm = nn.Parameter(torch.ones(hidden))
        self.q_proj = nn.Linear(2 * hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(hidden))
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        theta = config["_rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("draft_to_target", torch.arange(draft_vocab), persistent=True)

    # --- one draft step --------------------------------------------------------------------------

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        return project_qkv(self, x, positions, self.heads, self.kv_heads, self.head_dim, self.inv_freq)

    def finish(self, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The pre-norm output: residual h, attention, then the MLP."""
        b, _, t, _ = attended.shape
        h2 = h + self.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        normed = rms(h2, self.post_attention_layernorm, self.eps)
        return h2 + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))

    def logits(self, pre: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rms(pre, self.norm, self.eps))

    # --- chained drafting ------------------------------------------------------------------------

    def rollout(self, embeds: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Pre-norm outputs of draft steps 1..steps at every position, (B, T, H) each.

        Position i reads the embedding of token i+1; step 1 reads fc(aux i), step j+1 reads step j's
        output at i-1, as vLLM chains them."""
        t = embeds.shape[1]
        positions = torch.arange(t, device=embeds.device)
        embeds_normed = rms(embeds, self.input_layernorm, self.eps)
        keys, values, outputs = [], [], []
        h = self.fc(aux)
        for _ in range(steps):
            x = torch.cat((embeds_normed, rms(h, self.hidden_norm, self.eps)), -1)
            q, k, v = self.qkv(x, positions)
            keys.append(k)
            values.append(v)
            pre = self.finish(h, self.attend(q, keys, values, positions))
            outputs.append(pre)
            h = _shift_right(pre, 1, dim=1)
        return outputs

    def attend(self, q: torch.Tensor, keys: list, values: list, positions: torch.Tensor) -> torch.Tensor:
        return chained_attention(q, keys, values, positions, self.head_dim)


# --- initialisation ------------------------------------------------------------------------------


def init_from_target(head: Eagle3Head, tensors: dict[str, torch.Tensor], config: dict,
                     draft_ids: torch.Tensor) -> None:
    """Start as 'the target's last layer on its late residual stream': fc passes the last aux state
    through, q/k/v read it with the target's last-layer weights (the embedding half starts small),
    the output projections start at zero, and the LM head is the target's own rows for the draft
    vocabulary behind the target's final norm."""
    hidden = config["hidden_size"]
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    embedding = tensors["model.embed_tokens.weight"].float()
    lm_head = tensors.get("lm_head.weight", embedding).float()
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * hidden:] = torch.eye(hidden, device=head.fc.weight.device)
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(head, name).weight
            weight.normal_(0.0, 0.01)
            weight[:, hidden:] = tensors[last + f"self_attn.{name}.weight"].float()
        head.hidden_norm.copy_(tensors[last + "input_layernorm.weight"].float())
        head.post_attention_layernorm.copy_(tensors[last + "post_attention_layernorm.weight"].float())
        for name in ("gate_proj", "up_proj"):
            getattr(head, name).weight.copy_(tensors[last + f"mlp.{name}.weight"].float())
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.norm.copy_(tensors["model.norm.weight"].float())
        head.lm_head.weight.copy_(lm_head[draft_ids.to(lm_head.device)])
        head.draft_to_target.copy_(draft_ids)


# --- export --------------------------------------------------------------------------------------


def checkpoint_tensors(head: Eagle3Head, vocab_size: int) -> dict[str, torch.Tensor]:
    """vLLM's EAGLE-3 Llama checkpoint names (layer 0 is `layers.0.`; `midlayer.` also loads)."""
    fp16 = {"fc.weight": head.fc.weight, "norm.weight": head.norm, "lm_head.weight": head.lm_head.weight,
            "layers.0.input_layernorm.weight": head.input_layernorm,
            "layers.0.hidden_norm.weight": head.hidden_norm,
            "layers.0.post_attention_layernorm.weight": head.post_attention_layernorm}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        fp16[f"layers.0.self_attn.{name}.weight"] = getattr(head, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        fp16[f"layers.0.mlp.{name}.weight"] = getattr(head, name).weight
    tensors = {name: t.detach().to(torch.float16).cpu().contiguous() for name, t in fp16.items()}
    draft_ids = head.draft_to_target.detach().cpu().long()
    tensors["d2t"] = (draft_ids - torch.arange(len(draft_ids))).contiguous()
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    return tensors


def head_config(target_config: dict, draft_vocab: int) -> dict:
    config = {k: v for k, v in target_config.items() if not k.startswith("_") and k not in (
        "transformers_version", "dtype", "torch_dtype", "architectures")}
    num_layers = target_config["num_hidden_layers"]
    config.update(architectures=["LlamaForCausalLM"], num_hidden_layers=1, draft_vocab_size=draft_vocab,
                  target_hidden_size=target_config["hidden_size"], tie_word_embeddings=False,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": aux_layer_ids(num_layers),
                                "use_aux_hidden_state": True},
                  torch_dtype="float16")
    return config


def load_exported(folder: Path, target_config: dict) -> Eagle3Head:
    """A head back from its exported folder (tests and the golden-value check)."""
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    head = Eagle3Head(target_config, config["draft_vocab_size"])
    state = {"fc.weight": tensors["fc.weight"], "norm": tensors["norm.weight"],
             "lm_head.weight": tensors["lm_head.weight"],
             "input_layernorm": tensors["layers.0.input_layernorm.weight"],
             "hidden_norm": tensors["layers.0.hidden_norm.weight"],
             "post_attention_layernorm": tensors["layers.0.post_attention_layernorm.weight"]}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"{name}.weight"] = tensors[f"layers.0.self_attn.{name}.weight"]
    for name in ("gate_proj", "up_proj", "down_proj"):
        state[f"{name}.weight"] = tensors[f"layers.0.mlp.{name}.weight"]
    state["draft_to_target"] = torch.arange(len(tensors["d2t"])) + tensors["d2t"].long()
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return head
