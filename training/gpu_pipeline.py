"""The whole EAGLE-3 pipeline in one run, with plain PyTorch and transformers (no vLLM): made for a GPU
machine that has torch, transformers and safetensors but cannot install vLLM, and tested here on the
CPU at a tiny scale.

    python training/gpu_pipeline.py --target DIR --prompts prompts.json --out OUT --budget-s 480
    python training/gpu_pipeline.py --gguf FILE --config-dir DIR ...    # the demo target from its GGUF
    python training/gpu_pipeline.py --join OUT/head                     # after --split-lm-head
    python training/gpu_pipeline.py ... --tokens OLD/tokens-*.pt --init-head OLD/head   # resume

Stages, all inside one wall-clock budget (each leaves the time the next ones need):
  questions (--questions N) the target writes new chat questions by continuing few-shot question
            lists (sampled); the ones that are one new question, not near a bench question, become
            prompts, answered first
  generate  the target answers every prompt greedily with batched `generate` (left padding); the
            bench's held-out prompts (split "bench") are answered too, for evaluation only
  vocab     the draft vocabulary: the N tokens the target produced most often; the share of target
            tokens each candidate N covers is recorded
  train     one or more EAGLE-3 heads (one per --lrs value) on the same batches; the target's aux
            hidden states, its final features and its distribution over the draft vocabulary are
            computed on the fly, so nothing large is stored; a learning curve (validation top-1 per
            draft step and exact acceptance length against tokens seen) is logged as it goes
  export    the best head in vLLM's EAGLE-3 layout (training/eagle3.py), config.json, manifest.json;
            the token data as a compact uint16 file so a later CPU session can reuse it

Resuming across sessions: `--tokens` takes an earlier run's shards (their prompts are not answered
again; generation is greedy and the prompt order seeded, so the rest continues where it stopped) and
`--init-head` an exported head to train on from, keeping its draft vocabulary.

The prompts file is made on a machine with the tokenizer (`python training/prompts.py --ids-out F`),
so this script needs no tokenizer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from eagle3 import (  # noqa: E402
    Eagle3Head, aux_layer_ids, checkpoint_tensors, head_config, init_from_target, load_exported)
from head import make_batches  # noqa: E402

STEP_WEIGHTS = (1.0, 0.7, 0.5, 0.35, 0.25)
VOCAB_CANDIDATES = (1024, 2048, 4096, 8192, 16384)
VALIDATION_SHARE = 0.03


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", type=Path, help="the target as a transformers folder (safetensors)")
    source.add_argument("--gguf", type=Path, help="the target as a GGUF file (needs the gguf package)")
    parser.add_argument("--config-dir", type=Path, help="with --gguf: the folder whose config.json the target uses")
    parser.add_argument("--expect-sha", help="sha256 of the target's fp32 weights (fingerprint()): checked, recorded")
    parser.add_argument("--prompts", type=Path, required=True, help="JSON from training/prompts.py --ids-out")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--budget-s", type=float, default=480.0, help="wall clock for everything")
    parser.add_argument("--generate-share", type=float, default=0.4, help="share of the budget for generation")
    parser.add_argument("--reserve-s", type=float, default=25.0, help="kept back for the final evaluation and export")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-seqs", type=int, default=1024, help="prompts per generate call")
    parser.add_argument("--generate-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="generation only (features and training stay fp32/TF32): bfloat16 answers faster "
                             "but its greedy text drifts a little from what the fp32 demo serves")
    parser.add_argument("--questions", type=int, default=0,
                        help="first have the target write up to N new chat questions (sampled continuations of "
                             "the prompts file's few-shot lists), answered before the template prompts")
    parser.add_argument("--questions-share", type=float, default=0.08, help="share of the budget for --questions")
    parser.add_argument("--tokenizer", type=Path,
                        help="with --questions: the target's tokenizer folder (tokenizer.json, chat template)")
    parser.add_argument("--batch-tokens", type=int, default=32768, help="padded tokens per training batch")
    parser.add_argument("--draft-vocab", default="auto", help="N, or auto: the smallest candidate covering --coverage")
    parser.add_argument("--coverage", type=float, default=0.98)
    parser.add_argument("--max-draft-vocab", type=int, default=8192)
    parser.add_argument("--steps-ahead", type=int, default=4)
    parser.add_argument("--lrs", default="1e-3,3e-3", help="one head per learning rate, trained side by side")
    parser.add_argument("--eval-every-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=Path, nargs="*", default=[],
                        help="token shards of an earlier run (tokens-N.pt): their answers are reused, their "
                             "prompts are not generated again (runs resume across sessions)")
    parser.add_argument("--init-head", type=Path,
                        help="an exported head to train on from (its draft vocabulary is kept) instead of the target")
    parser.add_argument("--split-lm-head", action="store_true",
                        help="write the LM head as lm_head.safetensors beside model.safetensors (files come back "
                             "from the GPU machine in pieces of at most 16 MiB); join them with --join")
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.gguf and not args.config_dir:
        parser.error("--gguf needs --config-dir")
    if args.questions and not args.tokenizer:
        parser.error("--questions needs --tokenizer")
    return args


# --- target ----------------------------------------------------------------------------------------


def load_target(args, device: torch.device):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.target:
        model = AutoModelForCausalLM.from_pretrained(str(args.target), dtype=torch.float32)
        config = json.loads((args.target / "config.json").read_text())
    else:
        # As vspec builds the demo model: transformers de-quantises the GGUF into a plain Llama.
        quantised = AutoModelForCausalLM.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name,
                                                         dtype=torch.float32)
        config = json.loads((args.config_dir / "config.json").read_text())
        model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"}))
        model.load_state_dict(quantised.state_dict(), strict=False)
        model.tie_weights()
        del quantised
    rope = config.get("rope_parameters") or {}
    config["_rope_theta"] = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    return model.to(device).eval(), config


def fingerprint(state: dict[str, torch.Tensor], names: list[str]) -> str:
    """sha256 of the named tensors' fp32 bytes in name order: the same target here and there."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode())
        digest.update(state[name].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class TargetFeatures:
    """One target forward: the aux residual streams vLLM hands an EAGLE-3 head, and the final
    (normed) features the LM head reads."""

    def __init__(self, model, config: dict):
        self.model, self.layers = model, aux_layer_ids(config["num_hidden_layers"])
        self.captured: dict[int, torch.Tensor] = {}
        for index in self.layers:
            # residual stream after `index` layers = output of decoder layer index-1
            model.model.layers[index - 1].register_forward_hook(self._hook(index))

    def _hook(self, index: int):
        def capture(_module, _inputs, output):
            self.captured[index] = output[0] if isinstance(output, tuple) else output
        return capture

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor):
        self.captured.clear()
        final = self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        aux = torch.cat([self.captured[index] for index in self.layers], -1)
        self.captured.clear()
        return aux, final


# --- questions ---------------------------------------------------------------------------------------


FUNCTION_WORDS = frozenset(
    "a an the and or but of to in on at for with about from by as into is are was were be been do does did "
    "can could should would will how what why when where which who whom some any so our your my their his her "
    "its it i you we they me us them this that these those there than then".split())


def words(text: str) -> set[str]:
    """The content words of a question: what it is about, not its form."""
    return set("".join(c if c.isalnum() else " " for c in text.lower()).split()) - FUNCTION_WORDS


def near(question: str, others: list[set[str]], threshold: float = 0.6) -> bool:
    """Content-word Jaccard similarity >= threshold with any of ``others``: a paraphrase, not a new question."""
    mine = words(question)
    return any(len(mine & other) / max(len(mine | other), 1) >= threshold for other in others)


def question_from(continuation: str) -> str | None:
    """The question the target wrote as the list's next item, or None when it wrote something else."""
    line = continuation.split("\n", 1)[0].strip()
    if not line.endswith("?") or not 3 <= len(line.split()) <= 40 or line[:1].isdigit():
        return None
    return line


@torch.no_grad()
def write_questions(model, tokenizer, spec: dict, args, deadline: float, device: torch.device,
                    pad: int) -> list[dict]:
    """New chat prompts written by the target itself: sampled continuations of few-shot question lists,
    kept when they are one question, new, and not a paraphrase of a held-out bench question or a seed.
    They make the training prompts as varied as the target's own idea of what people ask, where the
    template prompts (topic x form) all read alike."""
    lists, held_out = spec["question_prompts"], [words(q) for q in spec["held_out_questions"]]
    seeds = [words(q) for q in spec["question_seeds"]]
    rng, seen, rows, tried, batches = random.Random(args.seed + 1), set(), [], 0, 0
    while len(rows) < args.questions and time.perf_counter() < deadline:
        batch = [lists[rng.randrange(len(lists))] for _ in range(min(args.batch_seqs, 4 * args.questions))]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, prompt in enumerate(batch):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        torch.manual_seed(args.seed + batches)  # transformers samples from the global generator
        batches += 1
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                             temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=40, pad_token_id=pad)
        for text in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True):
            tried += 1
            question = question_from(text)
            if question is None or question.lower() in seen or near(question, held_out) or near(question, seeds, 0.8):
                continue
            seen.add(question.lower())
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                   add_generation_prompt=True)
            rows.append({"ids": tokenizer(prompt, add_special_tokens=False)["input_ids"], "split": "train",
                         "kind": "self", "question": question})
            if len(rows) >= args.questions:
                break
        log(f"questions: {len(rows)} kept of {tried} written")
    return rows


# --- generate ----------------------------------------------------------------------------------------


@torch.no_grad()
def generate(model, prompts: list[dict], args, deadline: float, device: torch.device, eos: list[int],
             pad: int, answered: set | None = None) -> list[dict]:
    """Greedy answers, bench prompts first, then the rest in a seeded order until the deadline;
    prompts in ``answered`` (token-id tuples) are skipped."""
    rng = random.Random(args.seed)
    answered = answered or set()
    order = [p for p in prompts if p["split"] == "bench" and tuple(p["ids"]) not in answered]
    rest = [p for p in prompts if p["split"] != "bench" and tuple(p["ids"]) not in answered]
    rng.shuffle(rest)
    # the target's own questions first: in a resumed run the template prompts are mostly answered already
    rest.sort(key=lambda p: p.get("kind") != "self")
    order += rest
    done, tokens, started = [], 0, time.perf_counter()
    for first in range(0, len(order), args.batch_seqs):
        if time.perf_counter() > deadline:
            log(f"generate: the time budget ends generation after {len(done)} of {len(order)} prompts")
            break
        batch = order[first:first + args.batch_seqs]
        width = max(len(p["ids"]) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, prompt in enumerate(batch):  # left padding: every prompt ends where generation starts
            ids[row, width - len(prompt["ids"]):] = torch.tensor(prompt["ids"])
            mask[row, width - len(prompt["ids"]):] = 1
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        for row, prompt in enumerate(batch):
            answer = out[row, width:].tolist()
            cut = next((i + 1 for i, token in enumerate(answer) if token in eos), len(answer))
            done.append(dict(prompt, output=answer[:cut]))
            tokens += cut
        rate = tokens / (time.perf_counter() - started)
        log(f"generate: {len(done)}/{len(order)} prompts, {tokens} tokens, {rate:.0f} tok/s")
    return done


# --- vocabulary --------------------------------------------------------------------------------------


def choose_vocab(rows: list[dict], args, vocab_size: int, always: list[int],
                 keep: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The draft vocabulary (sorted target ids) and its coverage; ``keep``: a head's own, measured."""
    produced = torch.tensor([token for row in rows for token in row["output"]], dtype=torch.long)
    counts = torch.bincount(produced, minlength=vocab_size)
    total = int(counts.sum())
    ranked = counts.argsort(descending=True)
    cumulative = counts[ranked].cumsum(0)
    coverage = {n: round(float(cumulative[min(n, vocab_size) - 1]) / max(total, 1), 4)
                for n in VOCAB_CANDIDATES if n <= vocab_size}
    if keep is not None:
        draft_ids = keep.detach().cpu().long()
        covered = float(counts[draft_ids].sum()) / max(total, 1)
        return draft_ids, {"size": len(draft_ids), "coverage_of_target_tokens": round(covered, 4),
                           "coverage_by_size": coverage, "counted_tokens": total, "kept_from": "--init-head"}
    if args.draft_vocab == "auto":
        fitting = [n for n, share in coverage.items() if share >= args.coverage and n <= args.max_draft_vocab]
        size = min(fitting) if fitting else min(args.max_draft_vocab, vocab_size)
    else:
        size = min(int(args.draft_vocab), vocab_size)
    chosen = [int(t) for t in ranked[:size]]
    for token in always:  # end-of-turn tokens must be draftable even if rare
        if token not in chosen:
            chosen[-1 - always.index(token)] = token
    draft_ids = torch.tensor(sorted(set(chosen)), dtype=torch.long)
    covered = float(counts[draft_ids].sum()) / max(total, 1)
    return draft_ids, {"size": len(draft_ids), "coverage_of_target_tokens": round(covered, 4),
                       "coverage_by_size": coverage, "counted_tokens": total}


# --- training ----------------------------------------------------------------------------------------


class Batch:
    """Right-padded sequences and, per draft step, the head positions whose prediction counts.

    Head position i reads token i+1 and the target's features at i; it predicts token i+2, whose
    distribution is the target's at i+1. Drafting starts at the prompt's last position (vLLM's
    first draft after prefill); step j+1 at position i chains from a first step at i-j."""

    def __init__(self, rows: list[dict], batch: list[int], steps: int, pad: int, device: torch.device):
        sequences = [rows[i]["ids"] + rows[i]["output"] for i in batch]
        width = max(map(len, sequences))
        self.ids = torch.full((len(batch), width), pad, dtype=torch.long)
        self.mask = torch.zeros((len(batch), width), dtype=torch.long)
        valid = torch.zeros((steps, len(batch), width - 1), dtype=torch.bool)
        for row, (index, sequence) in enumerate(zip(batch, sequences)):
            self.ids[row, :len(sequence)] = torch.tensor(sequence)
            self.mask[row, :len(sequence)] = 1
            first = len(rows[index]["ids"]) - 1
            last = len(sequence) - 3  # token i+2 must exist
            for j in range(steps):
                if first + j <= last:
                    valid[j, row, first + j:last + 1] = True
        self.ids, self.mask, self.valid = self.ids.to(device), self.mask.to(device), valid.to(device)
        self.positions = int(valid[0].sum())


class Trainer:
    def __init__(self, model, config: dict, draft_ids: torch.Tensor, args, device: torch.device,
                 start_head: Eagle3Head | None = None):
        self.model, self.config, self.args, self.device = model, config, args, device
        self.features = TargetFeatures(model, config)
        tensors = {name: t.detach() for name, t in model.state_dict().items()}
        self.embedding = tensors["model.embed_tokens.weight"].float()
        self.lm_head = tensors.get("lm_head.weight", self.embedding).float()
        self.draft_ids = draft_ids.to(device)
        self.draft_lm_head = self.lm_head[self.draft_ids]
        self.autocast = device.type == "cuda"
        self.heads = []
        for lr in (float(x) for x in args.lrs.split(",")):
            head = Eagle3Head(config, len(draft_ids)).to(device)
            if start_head is None:
                init_from_target(head, tensors, config, self.draft_ids)
            else:
                head.load_state_dict(start_head.state_dict())
            optimizer = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
            self.heads.append({"lr": lr, "head": head, "optimizer": optimizer})

    def teacher(self, batch: Batch):
        aux, final = self.features(batch.ids, batch.mask)
        embeds = self.embedding[batch.ids[:, 1:]]
        teacher_final = final[:, 1:]
        # The target's own next token (full vocabulary), in row chunks to bound memory.
        flat = teacher_final.reshape(-1, teacher_final.shape[-1])
        target_next = torch.cat([(chunk @ self.lm_head.T).argmax(-1) for chunk in flat.split(8192)])
        return embeds, aux[:, :-1], teacher_final, target_next.view(teacher_final.shape[:2])

    def losses(self, head: Eagle3Head, batch: Batch, inputs, steps: int):
        embeds, aux, teacher_final, target_next = inputs
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            outputs = head.rollout(embeds, aux, steps)
        losses, correct = [], []
        for j, out in enumerate(outputs):
            mask = batch.valid[j]
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                draft_logits = head.logits(out[mask])
            draft_logp = torch.log_softmax(draft_logits.float(), -1)
            teacher_p = torch.softmax(teacher_final[mask] @ self.draft_lm_head.T, -1)
            losses.append(-(teacher_p * draft_logp).sum(-1).mean())
            hit = torch.zeros_like(mask)
            hit[mask] = head.draft_to_target[draft_logits.argmax(-1)] == target_next[mask]
            correct.append(hit)
        return losses, correct

    def step(self, batch: Batch) -> list[float]:
        inputs = self.teacher(batch)
        values = []
        for entry in self.heads:
            losses, _ = self.losses(entry["head"], batch, inputs, self.args.steps_ahead)
            loss = sum(w * l for w, l in zip(STEP_WEIGHTS, losses))
            entry["optimizer"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(entry["head"].parameters(), 1.0)
            entry["optimizer"].step()
            values.append(loss.item())
        return values

    @torch.no_grad()
    def evaluate(self, batches: list[Batch]) -> list[dict]:
        """Per head: top-1 per draft step and the exact acceptance length at K=1..steps. The target's
        forward runs once per batch for all heads."""
        steps = self.args.steps_ahead
        tallies = [{"hits": [0] * steps, "counted": [0] * steps, "accepted": [0.0] * steps, "chains": 0}
                   for _ in self.heads]
        for batch in batches:
            inputs = self.teacher(batch)
            for entry, tally in zip(self.heads, tallies):
                _, correct = self.losses(entry["head"], batch, inputs, steps)
                self._tally(tally, batch, correct, steps)
        results = []
        for tally in tallies:
            rates = [round(h / max(n, 1), 4) for h, n in zip(tally["hits"], tally["counted"])]
            # acceptance length at K: the bonus token plus the leading accepted drafts, up to K
            lengths = [round(1 + sum(tally["accepted"][:k]) / max(tally["chains"], 1), 3) for k in range(1, steps + 1)]
            results.append({"top1_per_step": rates, "acceptance_length_by_k": lengths, "chains": tally["chains"]})
        return results

    @staticmethod
    def _tally(tally: dict, batch: Batch, correct: list[torch.Tensor], steps: int) -> None:
        for j in range(steps):
            tally["hits"][j] += int(correct[j].sum())
            tally["counted"][j] += int(batch.valid[j].sum())
        # Exact chains: a draft run starting at p is step j+1 at p+j; it accepts its leading hits.
        width = correct[0].shape[1] - (steps - 1)
        if width <= 0:
            return
        chain_valid = batch.valid[steps - 1][:, steps - 1:]
        running = torch.ones_like(chain_valid)
        for j in range(steps):
            running = running & correct[j][:, j:j + width]
            tally["accepted"][j] += float((running & chain_valid).sum())
        tally["chains"] += int(chain_valid.sum())


def learning_rate_factor(step: int, total: int, warmup: int = 50) -> float:
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, total) / total)))


def train(trainer: Trainer, rows: list[dict], args, deadline: float, pad: int, curve: list) -> dict:
    rng = random.Random(args.seed)
    train_rows = [i for i, row in enumerate(rows) if row["split"] != "bench"]
    bench_rows = [i for i, row in enumerate(rows) if row["split"] == "bench"]
    rng.shuffle(train_rows)
    n_val = max(2, int(len(train_rows) * VALIDATION_SHARE))
    # Validation comes from this run's answers when it resumes: a head trained on from --init-head has
    # seen the reused ones, and would be chosen over its trained-on versions for having memorised them.
    fresh = [i for i in train_rows if not rows[i].get("reused")]
    val_rows = (fresh if len(fresh) >= 2 * n_val else train_rows)[:n_val]
    chosen = set(val_rows)
    train_rows = [i for i in train_rows if i not in chosen]
    lengths = [len(row["ids"]) + len(row["output"]) for row in rows]
    steps, device = args.steps_ahead, trainer.device
    val = [Batch(rows, b, steps, pad, device) for b in make_batches(lengths, val_rows, args.batch_tokens, rng)]
    bench = [Batch(rows, b, steps, pad, device) for b in make_batches(lengths, bench_rows, args.batch_tokens, rng)]
    unique_positions = sum(max(0, lengths[i] - len(rows[i]["ids"]) - 1) for i in train_rows)
    started, step, seen, total_steps = time.perf_counter(), 0, 0, 10 ** 9
    step_10 = (started, 0)  # where the steps timed for the schedule start: 0, then 10
    schedules = [torch.optim.lr_scheduler.LambdaLR(e["optimizer"], lambda s: learning_rate_factor(s, total_steps))
                 for e in trainer.heads]
    best = {"score": -1.0}
    next_eval = started
    last_losses: list[float] = []
    loss_log: list[dict] = []  # every 50 steps: the last batch's weighted loss over the draft steps, per head

    def record(final: bool = False) -> None:
        nonlocal best
        val_results, bench_results = trainer.evaluate(val), trainer.evaluate(bench) if bench else None
        point = {"elapsed_s": round(time.perf_counter() - started, 1), "step": step, "positions_seen": seen,
                 "epochs": round(seen / max(unique_positions, 1), 3), "heads": []}
        for index, entry in enumerate(trainer.heads):
            result = {"lr": entry["lr"], "train_loss": round(last_losses[index], 4) if last_losses else None,
                      "val": val_results[index]}
            if bench_results:
                result["bench"] = bench_results[index]
            point["heads"].append(result)
            score = val_results[index]["acceptance_length_by_k"][min(2, steps - 1)]
            if score > best["score"]:
                best = {"score": score, "head": index, "step": step, "lr": entry["lr"],
                        "state": {k: v.detach().clone() for k, v in entry["head"].state_dict().items()}}
        curve.append(point)
        log(f"eval{' (final)' if final else ''}: " + json.dumps({k: v for k, v in point.items() if k != "heads"})
            + " " + " | ".join(f"lr {h['lr']}: val {h['val']['top1_per_step']} "
                               f"acc@k {h['val']['acceptance_length_by_k']}"
                               + (f" bench acc@k {h['bench']['acceptance_length_by_k']}" if "bench" in h else "")
                               for h in point["heads"]))

    epoch = 0
    while time.perf_counter() < deadline:
        for indices in make_batches(lengths, train_rows, args.batch_tokens, rng):
            if time.perf_counter() >= next_eval:
                record()
                next_eval = time.perf_counter() + args.eval_every_s
            batch = Batch(rows, indices, steps, pad, device)
            values = trainer.step(batch)
            last_losses[:] = values
            for schedule in schedules:
                schedule.step()
            step += 1
            seen += batch.positions
            if step in (10, 60):
                # Fit the cosine schedule to the time left: it must end when training does. Fitted again
                # at step 60 from the steps since 10: the first ones are slow (warm-up, allocator), and
                # run 2's fit at step 10 alone ended the schedule at half the steps that ran.
                since, since_step = step_10
                per_step = (time.perf_counter() - since) / (step - since_step)
                if step == 10:
                    step_10 = (time.perf_counter(), step)
                total_steps = max(step + 1, step + int((deadline - time.perf_counter()) / per_step * 0.9))
                log(f"train: {per_step * 1000:.0f} ms/step, about {total_steps} steps fit the budget")
            if step % 50 == 0:
                log(f"train: step {step} epoch {epoch} positions {seen} loss {[round(v, 3) for v in values]}")
                loss_log.append({"step": step, "epoch": epoch, "positions_seen": seen,
                                 "loss_by_lr": {entry["lr"]: round(v, 3) for entry, v in zip(trainer.heads, values)}})
            if time.perf_counter() >= deadline:
                break
        epoch += 1
    record(final=True)
    return {"steps": step, "positions_seen": seen, "unique_positions": unique_positions,
            "train_sequences": len(train_rows), "val_sequences": len(val_rows), "bench_sequences": len(bench_rows),
            "train_s": round(time.perf_counter() - started, 1), "best": best,
            "train_loss_log": {"source": "every 50 steps, the last batch's weighted loss over the draft steps",
                               "rows": loss_log}}


# --- export ------------------------------------------------------------------------------------------


def join_lm_head(folder: Path) -> None:
    """One model.safetensors again from a --split-lm-head export (the layout vLLM and vspec ship)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors.update(load_file(str(folder / "lm_head.safetensors")))
    save_file(tensors, str(folder / "model.safetensors.tmp"), metadata={"format": "pt"})
    (folder / "model.safetensors.tmp").replace(folder / "model.safetensors")
    (folder / "lm_head.safetensors").unlink()


def export(trainer: Trainer, best: dict, out: Path, manifest: dict, split_lm_head: bool = False) -> None:
    from safetensors.torch import save_file

    head = trainer.heads[best["head"]]["head"]
    head.load_state_dict(best["state"])
    out.mkdir(parents=True, exist_ok=True)
    tensors = checkpoint_tensors(head, trainer.config["vocab_size"])
    if split_lm_head:
        save_file({"lm_head.weight": tensors.pop("lm_head.weight")}, str(out / "lm_head.safetensors"),
                  metadata={"format": "pt"})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = head_config(trainer.config, len(trainer.draft_ids))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def save_tokens(rows: list[dict], folder: Path, shard_tokens: int = 6_000_000, max_shards: int = 3) -> int:
    """Every generated sequence as 16-bit ids (the vocabulary fits; read back with `& 0xFFFF`) with
    its prompt length, split and kind, in shards of at most 12 MB (files come back from the GPU
    machine in pieces of at most 16 MiB). Returns the number of sequences saved."""
    shard, size, written, saved = [], 0, 0, 0
    for row in rows + [None]:
        if row is not None:
            shard.append(row)
            size += len(row["ids"]) + len(row["output"])
        if shard and (row is None or size >= shard_tokens) and written < max_shards:
            flat = [token for r in shard for token in r["ids"] + r["output"]]
            torch.save({"tokens": torch.tensor(flat, dtype=torch.int32).to(torch.int16),
                        "prompt_lengths": torch.tensor([len(r["ids"]) for r in shard], dtype=torch.int32),
                        "output_lengths": torch.tensor([len(r["output"]) for r in shard], dtype=torch.int32),
                        "splits": [r["split"] for r in shard], "kinds": [r.get("kind", "") for r in shard]},
                       str(folder / f"tokens-{written}.pt"))
            written, saved, shard, size = written + 1, saved + len(shard), [], 0
    return saved


def load_tokens(paths: list[Path]) -> list[dict]:
    """The sequences of earlier runs' token shards, as generate() returns them."""
    rows = []
    for path in paths:
        saved = torch.load(str(path))
        tokens, offset = (saved["tokens"].long() & 0xFFFF).tolist(), 0
        for prompt_length, output_length, split, kind in zip(saved["prompt_lengths"].tolist(),
                                                             saved["output_lengths"].tolist(), saved["splits"],
                                                             saved["kinds"]):
            rows.append({"ids": tokens[offset:offset + prompt_length], "split": split, "kind": kind,
                         "output": tokens[offset + prompt_length:offset + prompt_length + output_length]})
            offset += prompt_length + output_length
    return rows


def read_prompts(path: Path) -> dict:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--join"]:
        join_lm_head(Path(argv[1]))
        return 0
    args = parse_args(argv)
    started = time.perf_counter()
    deadline = started + args.budget_s
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    spec = read_prompts(args.prompts)
    if args.questions and not spec.get("question_prompts"):
        # checked before the target loads: on a device the budget must not be spent finding out
        sys.exit(f"gpu_pipeline: {args.prompts} has no few-shot question lists for --questions; write it again "
                 "with training/prompts.py --ids-out")
    prompts, eos, pad = spec["prompts"], list(spec["eos_token_ids"]), spec["pad_token_id"]
    model, config = load_target(args, device)
    state = model.state_dict()
    names = spec.get("fingerprint_names") or sorted(state)
    sha = fingerprint(state, names)
    log(f"target: {sum(p.numel() for p in model.parameters())} parameters, sha256 {sha[:16]}"
        + ("" if not args.expect_sha else (" (matches)" if sha == args.expect_sha else " (DIFFERS from --expect-sha)")))
    timings = {"load_s": round(time.perf_counter() - started, 1)}

    generate_deadline = started + args.budget_s * args.generate_share
    earlier = [dict(row, reused=True) for row in load_tokens(args.tokens)]
    answered = {tuple(row["ids"]) for row in earlier}
    if earlier:
        log(f"reused: {len(earlier)} sequences, {sum(len(r['output']) for r in earlier)} answer tokens")
    generator = model
    if args.generate_dtype == "bfloat16":
        import copy

        generator = copy.deepcopy(model).to(torch.bfloat16)
    questions = []
    if args.questions:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
        questions = write_questions(generator, tokenizer, spec, args, time.perf_counter() + args.budget_s
                                    * args.questions_share, device, pad)
        timings["questions_s"] = round(time.perf_counter() - started - timings["load_s"], 1)
        (args.out / "questions.txt").write_text("".join(row["question"] + "\n" for row in questions))
    fresh = generate(generator, questions + prompts, args, generate_deadline, device, eos, pad, answered)
    rows = earlier + fresh
    fresh_tokens = sum(len(r["output"]) for r in fresh)
    del generator
    timings["generate_s"] = round(time.perf_counter() - started - timings["load_s"]
                                  - timings.get("questions_s", 0), 1)
    saved_sequences = save_tokens(rows, args.out)
    generated = sum(len(r["output"]) for r in rows if r["split"] != "bench")

    start_head = load_exported(args.init_head, config) if args.init_head else None
    draft_ids, vocab = choose_vocab([r for r in rows if r["split"] != "bench"], args, config["vocab_size"], eos,
                                    keep=None if start_head is None else start_head.draft_to_target)
    log(f"vocab: {json.dumps(vocab)}")

    trainer = Trainer(model, config, draft_ids, args, device, start_head)
    curve: list = []
    mark = time.perf_counter()
    result = train(trainer, rows, args, deadline - args.reserve_s, pad, curve)
    timings["train_s"] = round(time.perf_counter() - mark, 1)
    best = result.pop("best")
    manifest = {
        "what": "EAGLE-3 head with a reduced draft vocabulary, trained by training/gpu_pipeline.py",
        "command": "python training/gpu_pipeline.py " + " ".join(args.argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "seed": args.seed,
        "target_sha256": sha, "target_sha256_expected": args.expect_sha,
        "data": {"prompts_file_version": spec.get("version"), "prompts_available": len(prompts),
                 "self_written_questions": len(questions),
                 "self_written_answered": sum(1 for r in fresh if r.get("kind") == "self"),
                 "sequences": len(rows), "generated_train_tokens": generated, "saved_sequences": saved_sequences,
                 "reused_sequences": len(earlier), "reused_from": [str(p) for p in args.tokens],
                 "initial_head": str(args.init_head) if args.init_head else None,
                 "max_new_tokens": args.max_new_tokens, "greedy": True, "generate_dtype": args.generate_dtype,
                 "generate_tokens_per_s": round(fresh_tokens / max(timings["generate_s"], 1e-9)),
                 "held_out": "split 'bench' (the bench's chat prompts) is answered but never trained on"},
        "vocabulary": vocab,
        "training": dict(result, steps_ahead=args.steps_ahead, batch_tokens=args.batch_tokens,
                         lrs=args.lrs, chosen_lr=best.get("lr"), chosen_step=best.get("step"),
                         chosen_val_acceptance_k3=best.get("score")),
        "timings": timings,
        "learning_curve": curve,
    }
    export(trainer, best, args.out / "head", manifest, args.split_lm_head)
    log(f"export: {args.out / 'head'} (head {best.get('head')}, lr {best.get('lr')}, step {best.get('step')}); "
        f"{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
