"""Stage 2: the target's last hidden states for every generated sequence.

vLLM hands the EAGLE head the target's hidden state after the final norm (what the LM head reads), so
that is what we store, as fp16 to halve the file. The forward runs in bf16 autocast: about 3x faster
here than fp32, and its small error acts like the feature noise EAGLE adds on purpose; the hard
labels stay exact, since they are the tokens vLLM generated in fp32.
With it, the target's own next-token distribution at every position as its top TOP_K log-probs
(fp32 LM head): the distillation labels, computed once here instead of every training step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

TOP_K = 20


def load_target(target: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), torch_dtype=torch.float32)
    model.eval()
    return model


def extract(target: Path, generations: Path, out: Path, batch_tokens: int = 4096, bf16: bool = True) -> None:
    import torch

    if out.exists():
        return
    rows = [json.loads(line) for line in generations.read_text().splitlines() if line.strip()]
    sequences = [row["prompt_ids"] + row["output_ids"] for row in rows]
    prompt_lengths = [len(row["prompt_ids"]) for row in rows]
    model = load_target(target)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    features: list = [None] * len(sequences)
    teacher_ids: list = [None] * len(sequences)
    teacher_logp: list = [None] * len(sequences)
    started, done_tokens, total_tokens = time.perf_counter(), 0, sum(map(len, sequences))
    batch: list[int] = []

    def flush() -> None:
        nonlocal done_tokens
        length = max(len(sequences[i]) for i in batch)
        ids = torch.zeros(len(batch), length, dtype=torch.long)
        mask = torch.zeros(len(batch), length, dtype=torch.long)
        for row, index in enumerate(batch):
            ids[row, :len(sequences[index])] = torch.tensor(sequences[index])
            mask[row, :len(sequences[index])] = 1
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state  # after the final norm
            top = torch.log_softmax(model.lm_head(hidden).float(), dim=-1).topk(TOP_K, dim=-1)
        for row, index in enumerate(batch):
            n = len(sequences[index])
            features[index] = hidden[row, :n].to(torch.float16).clone()
            teacher_ids[index] = top.indices[row, :n].to(torch.int32).clone()
            teacher_logp[index] = top.values[row, :n].to(torch.float16).clone()
            done_tokens += len(sequences[index])
        rate = done_tokens / (time.perf_counter() - started)
        print(f"features: {done_tokens}/{total_tokens} tokens, {rate:.0f} tok/s", flush=True)
        batch.clear()

    for index in order:
        # right padding: positions of real tokens are unchanged, so no position ids are needed
        if batch and (len(batch) + 1) * len(sequences[index]) > batch_tokens:
            flush()
        batch.append(index)
    if batch:
        flush()
    torch.save({"tokens": [torch.tensor(s, dtype=torch.int32) for s in sequences], "features": features,
                "teacher_ids": teacher_ids, "teacher_logp": teacher_logp, "prompt_lengths": prompt_lengths}, str(out) + ".tmp")
    Path(str(out) + ".tmp").rename(out)
