"""Stages 3 and 4: the EAGLE-1 head, its training and its export.

Labels: the tokens vLLM generated (the target's exact greedy choices) and the target's top-k
distribution (soft labels), half each, plus a small regression onto the target's next feature.

The head is what vLLM's `EagleLlamaForCausalLM` runs (vllm/model_executor/models/llama_eagle.py):

    x = fc(cat[embed(token i+1), hidden i])          # embedding first
    h = x + o_proj(attention(x))                      # layer 0 has no input norm
    out = h + mlp(post_attention_layernorm(h))        # and the head has no final norm
    logits = target.lm_head(out)                      # embedding and LM head are the target's

Head position i sees token i+1 and the target's feature i and should produce feature i+1, whose
logits predict token i+2. Drafting chains it: draft step j feeds the head's own output of step j-1.

Training-time test: for step j at position i, vLLM's KV cache holds the step-1 keys (computed from
the target's true features) for positions up to i-(j-1), and then one key per later step, each
made from that step's own input. Training on exactly that attention pattern (as EAGLE-3 does)
makes steps 2 and 3 see at training time what they see when serving.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

STEP_WEIGHTS = (1.0, 0.7, 0.5, 0.35, 0.25)
FEATURE_LOSS_WEIGHT = 0.1
VALIDATION_SHARE = 0.04


def target_config(target: Path) -> dict:
    config = json.loads((target / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise SystemExit("only plain RoPE targets are supported by this trainer")
    config["_rope_theta"] = theta
    return config


class HeadLayer(nn.Module):
    """One Llama decoder layer of the head. vLLM gives layer 0 no input norm (the fc output goes in
    as is); later layers are plain pre-norm layers on the residual stream."""

    def __init__(self, config: dict, first: bool):
        super().__init__()
        hidden, inter = config["hidden_size"], config["intermediate_size"]
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        head_dim = config.get("head_dim") or hidden // heads
        self.eps = config["rms_norm_eps"]
        self.input_layernorm = None if first else nn.Parameter(torch.ones(hidden))
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(hidden))
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def attention_input(self, stream: torch.Tensor) -> torch.Tensor:
        return stream if self.input_layernorm is None else self.rms(stream, self.input_layernorm)

    def finish(self, stream: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attended.shape
        h = stream + self.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        normed = self.rms(h, self.post_attention_layernorm)
        return h + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))


class EagleHead(nn.Module):
    def __init__(self, config: dict, layers: int = 1):
        super().__init__()
        hidden = config["hidden_size"]
        self.heads, self.kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or hidden // self.heads
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(HeadLayer(config, first=index == 0) for index in range(layers))
        inv_freq = 1.0 / (config["_rope_theta"] ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # --- pieces ---------------------------------------------------------------------------------

    def project(self, layer: HeadLayer, x: torch.Tensor, positions: torch.Tensor):
        return project_qkv(layer, x, positions, self.heads, self.kv_heads, self.head_dim, self.inv_freq)

    # --- chained drafting ------------------------------------------------------------------------

    def rollout(self, embeds: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Outputs of draft steps 1..steps at every position (B, T, H) each, with vLLM's attention."""
        t = embeds.shape[1]
        positions = torch.arange(t)
        keys = [[] for _ in self.layers]  # per layer, per step: (B, heads, T, d)
        values = [[] for _ in self.layers]
        outputs = []
        inputs = features
        for j in range(1, steps + 1):
            stream = self.fc(torch.cat((embeds, inputs), -1))
            for index, layer in enumerate(self.layers):
                q, k, v = self.project(layer, layer.attention_input(stream), positions)
                keys[index].append(k)
                values[index].append(v)
                stream = layer.finish(stream, self.attend(q, keys[index], values[index], positions))
            outputs.append(stream)
            inputs = _shift_right(stream, 1, dim=1)  # step j+1 at position i reads step j's output at i-1
        return outputs

    def attend(self, q: torch.Tensor, keys: list, values: list, positions: torch.Tensor) -> torch.Tensor:
        return chained_attention(q, keys, values, positions, self.head_dim)


def project_qkv(projections: nn.Module, x: torch.Tensor, positions: torch.Tensor, heads: int, kv_heads: int,
                head_dim: int, inv_freq: torch.Tensor):
    """q (B, heads, T, d) and k, v (B, heads, T, d) from ``projections``' q_proj, k_proj and v_proj,
    rotary embedding on q and k, the kv heads repeated for GQA."""
    b, t, _ = x.shape
    q = projections.q_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
    k = projections.k_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)
    v = projections.v_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)
    q, k = neox_rope(q, positions, inv_freq), neox_rope(k, positions, inv_freq)
    group = heads // kv_heads
    return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def neox_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's Llama and HF's rotate_half)."""
    freqs = positions[:, None].float() * inv_freq[None]
    angles = torch.cat((freqs, freqs), -1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * angles.cos() + rotated * angles.sin()


def chained_attention(q: torch.Tensor, keys: list, values: list, positions: torch.Tensor,
                      head_dim: int) -> torch.Tensor:
    """Attention of draft step j = len(keys) with vLLM's KV cache pattern (module docstring): the
    step-1 keys for positions <= i-(j-1), then the key of step m at position i-(j-m), m = 2..j."""
    j, t = len(keys), positions.shape[0]
    scale = 1.0 / math.sqrt(head_dim)
    full = torch.matmul(q, keys[0].transpose(-1, -2)) * scale
    allowed = positions[None, :] <= positions[:, None] - (j - 1)
    full = full.masked_fill(~allowed, float("-inf"))
    diagonal_scores, diagonal_values = [], []
    for m in range(2, j + 1):
        shift = j - m
        k_m, v_m = _shift_right(keys[m - 1], shift), _shift_right(values[m - 1], shift)
        score = (q * k_m).sum(-1, keepdim=True) * scale
        if shift:
            score[:, :, :shift] = float("-inf")
        diagonal_scores.append(score)
        diagonal_values.append(v_m)
    scores = torch.cat([full, *diagonal_scores], -1) if diagonal_scores else full
    # the step's own key (m = j) is always allowed: no empty row; softmax in fp32 under autocast
    scores = scores.float().softmax(-1).to(q.dtype)
    attended = torch.matmul(scores[..., :t], values[0])
    for index, v_m in enumerate(diagonal_values):
        attended = attended + scores[..., t + index:t + index + 1] * v_m
    return attended


def _shift_right(x: torch.Tensor, shift: int, dim: int = 2) -> torch.Tensor:
    if shift == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = shift
    return torch.cat((x.new_zeros(pad_shape), x.narrow(dim, 0, x.shape[dim] - shift)), dim)


# --- initialisation, data ----------------------------------------------------------------------


def load_target_tensors(target: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(target.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def init_from_target(head: EagleHead, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """The target's last layers with their output projections zeroed, and fc passing the feature
    through: the head starts as 'repeat the target's last prediction' and learns the step ahead."""
    first_source = config["num_hidden_layers"] - len(head.layers)
    with torch.no_grad():
        for index, layer in enumerate(head.layers):
            source = f"model.layers.{first_source + index}."
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(layer, name).weight.copy_(tensors[source + f"self_attn.{name}.weight"])
            for name in ("gate_proj", "up_proj"):
                getattr(layer, name).weight.copy_(tensors[source + f"mlp.{name}.weight"])
            layer.post_attention_layernorm.copy_(tensors[source + "post_attention_layernorm.weight"])
            if layer.input_layernorm is not None:
                layer.input_layernorm.copy_(tensors[source + "input_layernorm.weight"])
            layer.o_proj.weight.zero_()
            layer.down_proj.weight.zero_()
        hidden = config["hidden_size"]
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.fc.weight[:, :hidden].normal_(0.0, 0.01)


def make_batches(lengths: list[int], indices: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    ordered = sorted(indices, key=lambda i: lengths[i])
    batches, current = [], []
    for index in ordered:
        if current and (len(current) + 1) * lengths[index] > batch_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(data: dict, batch: list[int], embedding: torch.Tensor, steps: int):
    """Padded head inputs and, per step, the positions whose loss counts."""
    length = max(len(data["tokens"][i]) for i in batch) - 1
    b, hidden = len(batch), embedding.shape[1]
    embeds = torch.zeros(b, length, hidden)
    feats = torch.zeros(b, length, hidden)
    target_feats = torch.zeros(b, length, hidden)
    teacher_ids = torch.zeros(b, length, data["teacher_ids"][batch[0]].shape[1], dtype=torch.long)
    teacher_logp = torch.full(teacher_ids.shape, -1e4)
    labels = torch.zeros(b, length, dtype=torch.long)
    valid = torch.zeros(steps, b, length, dtype=torch.bool)
    for row, index in enumerate(batch):
        tokens, features = data["tokens"][index].long(), data["features"][index].float()
        n = len(tokens) - 1  # head positions 0..n-1: token i+1, feature i -> feature i+1
        embeds[row, :n] = embedding[tokens[1:]]
        feats[row, :n] = features[:-1]
        target_feats[row, :n] = features[1:]
        teacher_ids[row, :n] = data["teacher_ids"][index][1:].long()
        teacher_logp[row, :n] = data["teacher_logp"][index][1:].float()
        labels[row, :n - 1] = tokens[2:]  # what vLLM generated: the target's exact greedy choice
        first_draft = data["prompt_lengths"][index] - 1  # after prefill, drafting starts here
        for j in range(steps):
            # step j+1 at position i chains from a first step at i-j, which must be a draft position
            start = first_draft + j
            if start < n - 1:
                valid[j, row, start:n - 1] = True
    return embeds, feats, target_feats, teacher_ids, teacher_logp, labels, valid


def step_losses(head: EagleHead, lm_head: torch.Tensor, batch_data, steps: int):
    embeds, feats, target_feats, teacher_ids, teacher_logp, labels, valid = batch_data
    outputs = head.rollout(embeds, feats, steps)
    losses, correct, counted = [], [], []
    teacher_p = teacher_logp.exp()
    teacher_p = teacher_p / teacher_p.sum(-1, keepdim=True)  # renormalised top-k distribution
    for j, out in enumerate(outputs):
        mask = valid[j]
        chosen = out[mask]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = F.linear(chosen, lm_head)
        logp = torch.log_softmax(logits.float(), -1)
        soft_ce = -(teacher_p[mask] * logp.gather(-1, teacher_ids[mask])).sum(-1).mean()
        hard_ce = F.nll_loss(logp, labels[mask])
        feature = F.smooth_l1_loss(chosen, target_feats[mask])
        losses.append(0.5 * (soft_ce + hard_ce) + FEATURE_LOSS_WEIGHT * feature)
        correct.append((logits.argmax(-1) == labels[mask]).sum().item())
        counted.append(int(mask.sum()))
    return losses, correct, counted


def acceptance_estimate(rates: list[float]) -> float:
    """Expected acceptance length for greedy chained drafts: 1 + a1 + a1*a2 + ..."""
    total, running = 1.0, 1.0
    for rate in rates:
        running *= rate
        total += running
    return total


def evaluate(head, lm_head, data, batches, embedding, steps) -> dict:
    head.eval()
    correct, counted, loss_sum = [0] * steps, [0] * steps, 0.0
    with torch.no_grad():
        for batch in batches:
            losses, c, n = step_losses(head, lm_head, collate(data, batch, embedding, steps), steps)
            loss_sum += sum(w * l.item() for w, l in zip(STEP_WEIGHTS, losses))
            correct = [a + b for a, b in zip(correct, c)]
            counted = [a + b for a, b in zip(counted, n)]
    head.train()
    rates = [c / max(n, 1) for c, n in zip(correct, counted)]
    return {"loss": loss_sum / max(len(batches), 1), "top1_per_step": [round(r, 4) for r in rates],
            "acceptance_estimate": round(acceptance_estimate(rates), 3)}


def train(target: Path, features_file: Path, work: Path, args) -> dict:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    config = target_config(target)
    tensors = load_target_tensors(target)
    embedding = tensors["model.embed_tokens.weight"].float()
    lm_head = tensors.get("lm_head.weight", embedding).float().to(torch.bfloat16)
    data = torch.load(str(features_file))
    lengths = [len(t) for t in data["tokens"]]
    indices = list(range(len(lengths)))
    rng.shuffle(indices)
    n_val = max(8, int(len(indices) * VALIDATION_SHARE))
    val_idx, train_idx = indices[:n_val], indices[n_val:]
    val_batches = make_batches(lengths, val_idx, args.batch_tokens, random.Random(0))
    head = EagleHead(config, layers=args.layers)
    resumed_from = None
    if getattr(args, "resume", False) and (work / "head.pt").exists():
        head = load_head(work / "head.pt", config)  # continue a finished run (a new schedule)
        previous = json.loads((work / "train.json").read_text()) if (work / "train.json").exists() else {}
        resumed_from = previous
    else:
        init_from_target(head, tensors, config)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    per_epoch = len(make_batches(lengths, train_idx, args.batch_tokens, rng))
    total_steps = max(1, int(per_epoch * args.epochs))
    warmup = max(1, min(50, total_steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(warmup, 1)) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps))))  # reads total_steps late
    steps = args.steps_ahead
    history = {"train_sequences": len(train_idx), "val_sequences": len(val_idx),
               "train_tokens": sum(lengths[i] for i in train_idx), "total_steps": total_steps, "log": []}
    history["initial_val"] = evaluate(head, lm_head, data, val_batches, embedding, steps)
    print("initial validation:", history["initial_val"], flush=True)
    best = dict(history["initial_val"], step=0)
    torch.save(head.state_dict(), work / "head.pt")
    started, step, epoch = time.perf_counter(), 0, 0
    deadline = started + args.time_budget_min * 60
    eval_every = max(20, per_epoch // 3)
    while step < total_steps and time.perf_counter() < deadline:
        for batch in make_batches(lengths, train_idx, args.batch_tokens, rng):
            losses, correct, counted = step_losses(head, lm_head, collate(data, batch, embedding, steps), steps)
            loss = sum(w * l for w, l in zip(STEP_WEIGHTS, losses))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step == 5:
                # Fit the schedule to the time budget: the cosine decay must end when training does.
                per_step = (time.perf_counter() - started) / step
                affordable = int(0.9 * (deadline - started) / per_step)
                if affordable < total_steps:
                    total_steps = max(step + 1, affordable)
                    history["total_steps"] = total_steps
                    eval_every = max(20, total_steps // 6)
                    print(f"train: {per_step:.1f} s/step, the time budget allows {total_steps} steps", flush=True)
            if step % 10 == 0:
                rates = [round(c / max(n, 1), 3) for c, n in zip(correct, counted)]
                print(f"train: step {step}/{total_steps} epoch {epoch} loss {loss.item():.3f} top1 {rates} "
                      f"{time.perf_counter() - started:.0f}s", flush=True)
            if step % eval_every == 0 or step >= total_steps or time.perf_counter() >= deadline:
                result = dict(evaluate(head, lm_head, data, val_batches, embedding, steps), step=step,
                              train_loss=round(loss.item(), 4), elapsed_s=round(time.perf_counter() - started))
                history["log"].append(result)
                print("validation:", result, flush=True)
                if result["acceptance_estimate"] > best["acceptance_estimate"]:
                    best = result
                    torch.save(head.state_dict(), work / "head.pt")
            if step >= total_steps or time.perf_counter() >= deadline:
                break
        epoch += 1
    history["best"] = best
    history["train_s"] = round(time.perf_counter() - started)
    if resumed_from:
        history["resumed_from"] = {k: resumed_from.get(k) for k in ("best", "train_s", "total_steps", "log")}
        history["train_s"] += resumed_from.get("train_s") or 0
    (work / "train.json").write_text(json.dumps(history, indent=2))
    return history


# --- export ------------------------------------------------------------------------------------


def load_head(path: Path, config: dict) -> EagleHead:
    """A saved head.pt; its layer count comes from the names (files from before multi-layer heads,
    whose layer tensors had no "layers.0." prefix, load too)."""
    state = torch.load(str(path))
    if "q_proj.weight" in state:
        state = {name if name.startswith("fc.") else f"layers.0.{name}": tensor for name, tensor in state.items()}
    layers = len({name.split(".")[1] for name in state if name.startswith("layers.")})
    head = EagleHead(config, layers=layers)
    head.load_state_dict(state)
    return head


def checkpoint_tensors(head: EagleHead) -> dict[str, torch.Tensor]:
    """HF/vLLM names, as EAGLE-1 Llama heads ship them (layer 0 has no input_layernorm)."""
    names = {"fc.weight": head.fc.weight}
    for index, layer in enumerate(head.layers):
        prefix = f"layers.{index}."
        if layer.input_layernorm is not None:
            names[prefix + "input_layernorm.weight"] = layer.input_layernorm
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[prefix + f"self_attn.{name}.weight"] = getattr(layer, name).weight
        names[prefix + "post_attention_layernorm.weight"] = layer.post_attention_layernorm
        for name in ("gate_proj", "up_proj", "down_proj"):
            names[prefix + f"mlp.{name}.weight"] = getattr(layer, name).weight
    return {name: tensor.detach().to(torch.float16).contiguous() for name, tensor in names.items()}


def export(target: Path, work: Path, out: Path, args) -> None:
    from safetensors.torch import save_file

    config = target_config(target)
    head = load_head(work / "head.pt", config)
    out.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(head), str(out / "model.safetensors"), metadata={"format": "pt"})
    head_config = {k: v for k, v in config.items() if not k.startswith("_") and k not in (
        "transformers_version", "_model_name_or_path")}
    head_config.update(num_hidden_layers=len(head.layers), architectures=["LlamaForCausalLM"], torch_dtype="float16")
    head_config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(head_config, indent=2) + "\n")
    history = json.loads((work / "train.json").read_text()) if (work / "train.json").exists() else {}
    runs = sorted(work.glob("run-*.json"))
    manifest = {
        "what": "EAGLE-1 head for SmolLM2-135M-Instruct (vspec demo), trained on this machine's CPU",
        "command": "python training/train_eagle.py " + " ".join(getattr(args, "argv", [])),
        "seed": args.seed,
        "data": {"prompts": f"training/prompts.py: {args.prompts} seeded chat prompts + HumanEval, "
                            "answered greedily by the target (max_tokens "
                            f"{args.max_tokens}); the bench's chat prompts are held out",
                 "train_sequences": history.get("train_sequences"), "val_sequences": history.get("val_sequences"),
                 "train_tokens": history.get("train_tokens")},
        "training": {"layers": len(head.layers), "steps_ahead": args.steps_ahead, "lr": args.lr, "batch_tokens": args.batch_tokens,
                     "epochs": args.epochs, "total_steps": history.get("total_steps"),
                     "train_s": history.get("train_s"), "initial_val": history.get("initial_val"),
                     "best_val": history.get("best"), "log": history.get("log")},
        "stage_runs": [json.loads(r.read_text()) for r in runs],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
