"""What does one draft pass cost next to one target decode step? vLLM on this CPU, the demo target.

For SmolLM2-135M (the demo target, fp32) and K=1, times inside the engine (engine core in this
process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; one child process per engine, one engine at a time):

  target step   the target's forward + its LM head (compute_logits) in a pure decode step of a
                target-only engine: B tokens, one per request;
  verify step   the same in a speculative engine at K=1: 2B tokens (each request's token + its draft);
  draft pass    one call of the EAGLE proposer's ``propose`` at K=1: the head's forward over the
                verified tokens, its LM head, the argmax and the input preparation around them;

for (a) the shipped EAGLE-1 head (drafters/smollm2-eagle; its LM head is the target's, over the full
vocabulary) and (b) an EAGLE-3 head with a reduced draft vocabulary of N ids (random weights, d2t =
the first N ids; built once under --work, default bench-out/draft-cost), at batch 1 and 8. Medians
over the decode steps of ``--tokens`` tokens per request, after one warm-up batch. Torch runs eager
(``enforce_eager``): these are the op costs, without torch.compile.

    .venv/bin/python benchmarks/draft_cost.py [--draft-vocab 8192] [--batch 1,8] [--tokens 24] [--json]

Wall times on a shared CPU: read the ratio draft pass / target step, not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = Path(os.environ.get("VSPEC_DEMO_MODEL", Path.home() / ".local/share/vspec/models/demo"))
RESULT_MARK = "@@draft-cost "


# --- the child: one engine, timers around the target and the proposer ----------------------------


def _child(config: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import vllm.model_executor.models.llama as llama
    from vllm import LLM, SamplingParams
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    state = {"phase": None, "forward": None}
    records: list[tuple[str, str, int, float]] = []  # (phase, what, tokens, seconds)

    def forward(original):
        def timed(self, input_ids=None, *args, **kwargs):
            if type(self) is not llama.LlamaForCausalLM:  # a head subclassing it
                return original(self, input_ids, *args, **kwargs)
            started = time.perf_counter()
            out = original(self, input_ids, *args, **kwargs)
            tokens = int(input_ids.shape[0]) if input_ids is not None else 0
            state["forward"] = (tokens, time.perf_counter() - started)
            return out
        return timed

    def logits(original):
        def timed(self, hidden_states, *args, **kwargs):
            if type(self) is not llama.LlamaForCausalLM:
                return original(self, hidden_states, *args, **kwargs)
            started = time.perf_counter()
            out = original(self, hidden_states, *args, **kwargs)
            elapsed = time.perf_counter() - started
            if state["forward"] is not None and state["phase"]:
                tokens, forward_s = state["forward"]
                records.append((state["phase"], "target", tokens, forward_s + elapsed))
            state["forward"] = None
            return out
        return timed

    def propose(original):
        def timed(self, *args, **kwargs):
            started = time.perf_counter()
            out = original(self, *args, **kwargs)
            if state["phase"]:
                records.append((state["phase"], "draft", 0, time.perf_counter() - started))
            return out
        return timed

    llama.LlamaForCausalLM.forward = forward(llama.LlamaForCausalLM.forward)
    llama.LlamaForCausalLM.compute_logits = logits(llama.LlamaForCausalLM.compute_logits)
    SpecDecodeBaseProposer.propose = propose(SpecDecodeBaseProposer.propose)

    speculative = None
    if config["method"] != "none":
        speculative = {"method": config["method"], "model": config["head"], "num_speculative_tokens": 1}
    llm = LLM(model=str(DEMO), dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=16,
              enable_prefix_caching=False, speculative_config=speculative, seed=0)
    sys.path.insert(0, str(REPO))
    from vspec_cli.workloads import CHAT_QUESTIONS

    params = SamplingParams(temperature=0.0, max_tokens=config["tokens"], ignore_eos=True)
    questions = list(CHAT_QUESTIONS)
    llm.generate(questions[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for batch in config["batches"]:
        prompts = [questions[i % len(questions)] for i in range(batch)]
        state["phase"] = f"b{batch}"
        llm.generate(prompts, params, use_tqdm=False)
        state["phase"] = None
    result: dict = {}
    for batch in config["batches"]:
        phase = f"b{batch}"
        decode_tokens = batch * (1 if config["method"] == "none" else 2)
        target = [s for p, what, n, s in records if p == phase and what == "target" and n == decode_tokens]
        drafts = [s for p, what, n, s in records if p == phase and what == "draft"]
        result[str(batch)] = {
            "target_ms": 1e3 * statistics.median(target) if target else None,
            "target_steps": len(target),
            "draft_ms": 1e3 * statistics.median(drafts) if drafts else None,
            "draft_passes": len(drafts),
        }
    return result


# --- the parent: heads, one child per engine, the table --------------------------------------------


def build_eagle3_head(folder: Path, draft_vocab: int) -> Path:
    """A random EAGLE-3 head for the demo target in the trainer's layout, d2t = the first N ids."""
    if (folder / "config.json").exists() and json.loads((folder / "config.json").read_text()).get(
            "draft_vocab_size") == draft_vocab:
        return folder
    sys.path.insert(0, str(REPO / "tests"))
    import tiny_models

    return tiny_models.build_llama_eagle3_head(folder, DEMO, seed=0, draft_ids=range(draft_vocab), informative=False)


def run_child(config: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(config)], capture_output=True, text=True,
                          cwd=REPO, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{config['label']}: engine failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_MARK):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=24, help="tokens generated per request")
    parser.add_argument("--work", default=str(REPO / "bench-out" / "draft-cost"), help="where the EAGLE-3 head goes")
    parser.add_argument("--eagle1", default=str(REPO / "drafters" / "smollm2-eagle"))
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(RESULT_MARK + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0

    batches = [int(b) for b in args.batch.split(",")]
    head3 = build_eagle3_head(Path(args.work) / f"eagle3-n{args.draft_vocab}", args.draft_vocab)
    engines = [("target-only", "none", None), ("eagle-1 (full vocab)", "eagle", args.eagle1),
               (f"eagle-3 (N={args.draft_vocab})", "eagle3", str(head3))]
    results = {}
    for label, method, head in engines:
        started = time.perf_counter()
        results[label] = run_child({"label": label, "method": method, "head": head, "batches": batches,
                                    "tokens": args.tokens})
        print(f"# {label}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    rows = []
    for batch in batches:
        target = results["target-only"][str(batch)]["target_ms"]
        for label, method, _ in engines[1:]:
            found = results[label][str(batch)]
            draft = found["draft_ms"]
            rows.append({"batch": batch, "drafter": label, "target_step_ms": target,
                         "verify_step_ms_k1": found["target_ms"], "draft_pass_ms": draft,
                         "draft_over_target": draft / target if draft and target else None,
                         "draft_passes": found["draft_passes"], "target_steps": results["target-only"][str(batch)]["target_steps"]})
    if args.json:
        print(json.dumps({"draft_vocab": args.draft_vocab, "tokens": args.tokens, "rows": rows}, indent=2))
        return 0
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    print(f"{'batch':>5}  {'drafter':<22} {'target step ms':>14} {'verify K=1 ms':>13} {'draft pass ms':>13} {'draft/target':>12}")
    for row in rows:
        print(f"{row['batch']:>5}  {row['drafter']:<22} {fmt(row['target_step_ms']):>14} {fmt(row['verify_step_ms_k1']):>13} "
              f"{fmt(row['draft_pass_ms']):>13} {fmt(row['draft_over_target']):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
