"""Stage 1: SmolLM2 answers the prompt set (greedy, in vLLM on the CPU): self-distillation data.

Writes one JSON line per prompt {"prompt", "prompt_ids", "output_ids"} in chunks, so a run that is
stopped resumes where it was and a partial file is usable.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def generate(model: Path, prompts: list[str], out: Path, max_tokens: int, chunk: int = 256,
             max_num_seqs: int = 128) -> int:
    done = set()
    if out.exists():
        done = {json.loads(line)["prompt"] for line in out.read_text().splitlines() if line.strip()}
    todo = [p for p in prompts if p not in done]
    if not todo:
        return len(done)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), dtype="float32", max_model_len=1024, max_num_seqs=max_num_seqs,
              gpu_memory_utilization=0.3, seed=0, enable_prefix_caching=False)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    started, tokens = time.perf_counter(), 0
    for first in range(0, len(todo), chunk):
        batch = todo[first:first + chunk]
        rendered = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                  add_generation_prompt=True) for p in batch]
        results = llm.generate(rendered, params, use_tqdm=False)
        with out.open("a") as handle:
            for prompt, result in zip(batch, results):
                output_ids = list(result.outputs[0].token_ids)
                tokens += len(output_ids)
                handle.write(json.dumps({"prompt": prompt, "prompt_ids": list(result.prompt_token_ids),
                                         "output_ids": output_ids}) + "\n")
        elapsed = time.perf_counter() - started
        print(f"generate: {first + len(batch)}/{len(todo)} prompts, {tokens} tokens, "
              f"{tokens / elapsed:.0f} tok/s", flush=True)
    return len(done) + len(todo)
