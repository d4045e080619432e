"""Record where n-gram lookup gets the demo's real answers right, token by token, for replaying policies.

The demo's greedy answers are the same for every policy, and n-gram lookup is a pure function of the
context, so what any K commits on them is fixed by two numbers per answer token t: P(t), the draft
length the lookup proposes there (0: no match), and L(t), how many of those drafts equal the answer's
next tokens. `vspec_runtime.control.replay` steps a policy through them (exact acceptance, modelled
step cost): every K it tries commits what vLLM would have committed on that text.

Usage (after a `vspec bench` of the demo with `--prompts same`, which saves the answers):

    .venv/bin/python benchmarks/demo_runs.py bench-out/reference-14 benchmarks/data/demo_ngram_runs.json

Reads the first round of every cell from OUT/outputs/<first policy>-r1.json, rebuilds each prompt as
the bench sent it (the workload's prompts through the demo's chat template), and calls vLLM's own
n-gram proposer (`_find_longest_matched_ngram_and_propose_tokens`, the demo preset's n 1-4) at
every answer position. Writes {"source", "ngram": [min, max], "cells": {cell: [{"L": [...],
"P": [...]}, ...]}}.

The serve bench's pool (every copy, code and chat prompt, as `--workload copy,code,chat` draws them):

    .venv/bin/python benchmarks/demo_runs.py --serve-pool benchmarks/data/demo_serve_pool_runs.json

generates each prompt's greedy answer (64 tokens, the closed-loop benches' `--max-tokens`) with an
offline engine of the demo model, without speculation (greedy answers are the same with it), and
writes the same record with one cell per workload ("copy", "code", "chat"), for
`replay.replay_server` (about 5 minutes here).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

LOOKAHEAD = 16  # drafts asked of the lookup per position: past any K the controller runs
NGRAM_MIN, NGRAM_MAX = 1, 4  # the demo preset's ngram_min / ngram_max
MAX_MODEL_LEN = 2048  # the demo preset's


def answer_runs(prompt_ids: list[int], answer: list[int]) -> dict[str, list[int]]:
    """P(t) and L(t) for every answer position t, as vLLM's n-gram proposer sees the context."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose

    context = np.array(prompt_ids + answer, dtype=np.int64)
    proposed, right = [], []
    for position in range(len(answer)):
        drafts = propose(context[: len(prompt_ids) + position], NGRAM_MIN, NGRAM_MAX, MAX_MODEL_LEN, LOOKAHEAD)
        run = 0
        while run < len(drafts) and position + run < len(answer) and drafts[run] == answer[position + run]:
            run += 1
        proposed.append(int(len(drafts)))
        right.append(run)
    return {"L": right, "P": proposed}


def main(bench_dir: str, out_path: str) -> int:
    from transformers import AutoTokenizer

    from vspec_cli import model_store
    from vspec_cli.offline_run import _render  # the bench's own prompt rendering (chat template)
    from vspec_cli.workloads import load_workload

    bench = Path(bench_dir)
    first_outputs = sorted((bench / "outputs").glob("*-r1.json"))
    if not first_outputs:
        print(f"demo_runs: no outputs in {bench / 'outputs'} (run `vspec bench --preset demo` first)", file=sys.stderr)
        return 2
    answers = {entry["name"]: entry["token_ids"] for entry in json.loads(first_outputs[0].read_text())}
    demo = model_store.resolve("demo").path
    if demo is None:
        print("demo_runs: the demo model is not prepared (`vspec models prepare demo`)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(demo)
    cells: dict[str, list[dict[str, list[int]]]] = {}
    for name, token_ids in answers.items():
        cell, round_number = name.split("#")
        if round_number != "1":
            continue
        kind, batch = cell.split("@")
        prompts = load_workload(kind).phases(int(batch), 1, same_prompts=True)[0].prompts
        rows = []
        for prompt, answer in zip(prompts, token_ids):
            rows.append(answer_runs(tokenizer(_render(tokenizer, prompt, True))["input_ids"], answer))
        cells[cell] = rows
    answers = write_record(out_path, f"{bench.name}: {first_outputs[0].name}, round 1 of each cell", cells)
    print(f"demo_runs: {answers} answers in {len(cells)} cells -> {out_path}")
    return 0


def write_record(out_path: str, source: str, cells: dict[str, list[dict[str, list[int]]]]) -> int:
    """Write the replay record; returns the number of answers in it."""
    record = {"source": source, "ngram": [NGRAM_MIN, NGRAM_MAX], "cells": cells}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return sum(len(rows) for rows in cells.values())


POOL_MAX_TOKENS = 64


def serve_pool(out_path: str) -> int:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from vspec_cli import model_store
    from vspec_cli.benchlib.serve_cli import prompt_pool
    from vspec_cli.offline_run import _render
    from vspec_cli.workloads import load_workload

    demo = model_store.resolve("demo").path
    if demo is None:
        print("demo_runs: the demo model is not prepared (`vspec models prepare demo`)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(demo)
    llm = LLM(model=str(demo), dtype="float32", max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.3,
              max_num_seqs=16, enable_prefix_caching=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=POOL_MAX_TOKENS)
    cells: dict[str, list[dict[str, list[int]]]] = {}
    for kind in ("copy", "code", "chat"):
        _, prompts = prompt_pool([load_workload(kind)])  # the serve driver's own pool of that workload
        rendered = [_render(tokenizer, prompt, True) for prompt in prompts]
        outputs = llm.generate(rendered, greedy)
        cells[kind] = [answer_runs(tokenizer(text)["input_ids"], list(output.outputs[0].token_ids))
                       for text, output in zip(rendered, outputs)]
    answers = write_record(out_path, f"the serve pool's every prompt, greedy, {POOL_MAX_TOKENS} tokens", cells)
    print(f"demo_runs: {answers} answers of the serve pool -> {out_path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-pool":
        sys.exit(serve_pool(sys.argv[2]))
    if len(sys.argv) != 3:
        print(__doc__.split("Usage")[0].strip() + "\n\nusage: demo_runs.py BENCH_OUT_DIR OUT.json\n       demo_runs.py --serve-pool OUT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
