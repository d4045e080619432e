"""Generation throughput of the demo target's architecture on a GPU, with transformers' `generate`
(random weights: speed only, every row runs to full length). What sizes training/gpu_pipeline.py's
generation stage (docs/training.md, "More tokens"). For a GPU machine; it does not run on the CPU.

    python3 benchmarks/gpu_generate_speed.py CONFIG_JSON [OUT_JSON]

CONFIG_JSON: the demo model's config.json (~/.local/share/vspec/models/demo/config.json here; carry a
copy to the GPU machine).
"""

import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CASES = (("float32", 2048, 96), ("bfloat16", 2048, 96), ("bfloat16", 4096, 96), ("float16", 4096, 96))
PROMPT_TOKENS = 40


def main(config_path: str, out_path: str | None) -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    config = json.load(open(config_path))
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})).cuda().eval()
    generator = torch.Generator().manual_seed(0)
    results = []
    for dtype, batch, new in CASES:
        model = model.to(getattr(torch, dtype))
        ids = torch.randint(100, 40000, (batch, PROMPT_TOKENS), generator=generator).cuda()
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            model.generate(input_ids=ids[:64], attention_mask=mask[:64], do_sample=False, max_new_tokens=8,
                           min_new_tokens=8, pad_token_id=2)  # warm-up
            torch.cuda.synchronize()
            started = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                 min_new_tokens=new, pad_token_id=2)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
        tokens = batch * (out.shape[1] - PROMPT_TOKENS)
        results.append({"dtype": dtype, "batch": batch, "new_tokens": new, "s": round(elapsed, 2),
                        "tok_s": round(tokens / elapsed), "ms_per_step": round(elapsed / new * 1000, 1),
                        "max_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1)})
        print(results[-1], flush=True)
    if out_path:
        json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
