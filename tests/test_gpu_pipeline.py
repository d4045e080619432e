"""training/gpu_pipeline.py, the one-run EAGLE-3 pipeline for a GPU machine, run here on the CPU at a
tiny scale, unchanged: a later session with a GPU runs the same script.

One run on a tiny 8-layer Llama (built on the fly, the demo's tokenizer ids) with 40 prompts, 4 of
them held out as the "bench" split: it must generate, choose a draft vocabulary, train two heads side
by side, keep a learning curve, and export a head that vLLM's EAGLE-3 loader reads (through vLLM's
own model loader, no engine) with the d2t map and the LM head the trainer wrote.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

import draft_loader
from conftest import CACHE, REPO

torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "training"))

from eagle3 import Eagle3Head, checkpoint_tensors, load_exported  # noqa: E402

PROMPTS, BENCH, EXTRA = 40, 4, 10
DRAFT_VOCAB = 512


@pytest.fixture(scope="module")
def pipeline_run(demo_model_dir, tmp_path_factory) -> dict:
    import tiny_models as tm
    from transformers import AutoTokenizer

    vocab = json.loads((demo_model_dir / "config.json").read_text())["vocab_size"]
    target = CACHE / "tiny" / "llama-eagle3-target"
    if not (target / "config.json").exists():
        tm.build_llama_for_eagle3(target, demo_model_dir, seed=7, vocab_size=vocab)
    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    rows = []
    for index in range(PROMPTS):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": f"Tell me about item {index} please."}],
                                                 tokenize=False, add_generation_prompt=True)
        rows.append({"ids": tokenizer(rendered, add_special_tokens=False)["input_ids"],
                     "split": "bench" if index < BENCH else "train", "kind": "chat"})
    work = tmp_path_factory.mktemp("gpu-pipeline")
    prompts = work / "prompts.json.gz"
    with gzip.open(prompts, "wt", encoding="utf-8") as handle:
        json.dump({"version": "test", "prompts": rows, "eos_token_ids": [tokenizer.eos_token_id],
                   "pad_token_id": tokenizer.eos_token_id}, handle)
    out = work / "out"
    command = [sys.executable, str(REPO / "training" / "gpu_pipeline.py"), "--target", str(target),
               "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--budget-s", "30",
               "--generate-share", "0.4", "--batch-seqs", "20", "--max-new-tokens", "24", "--draft-vocab",
               str(DRAFT_VOCAB), "--steps-ahead", "3", "--lrs", "1e-3,3e-3", "--eval-every-s", "5",
               "--batch-tokens", "1024", "--reserve-s", "5", "--split-lm-head"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    split_files = sorted(p.name for p in (out / "head").iterdir())
    joined = subprocess.run([sys.executable, str(REPO / "training" / "gpu_pipeline.py"), "--join", str(out / "head")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert joined.returncode == 0, joined.stderr[-2000:]
    # A second run resumes from the first, its token shard and its head, with more prompts to answer.
    resumed, more_prompts = work / "resumed", work / "more-prompts.json.gz"
    extra = [{"ids": tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": f"And item {i}?"}],
                                                              tokenize=False, add_generation_prompt=True),
                               add_special_tokens=False)["input_ids"], "split": "train", "kind": "chat"}
             for i in range(EXTRA)]
    with gzip.open(more_prompts, "wt", encoding="utf-8") as handle:
        json.dump({"version": "test", "prompts": rows + extra, "eos_token_ids": [tokenizer.eos_token_id],
                   "pad_token_id": tokenizer.eos_token_id}, handle)
    command[command.index("--prompts") + 1] = str(more_prompts)
    command = command[:command.index("--out")] + ["--out", str(resumed)] + command[command.index("--out") + 2:]
    command = [c for c in command if c != "--split-lm-head"]
    command[command.index("--budget-s") + 1] = "20"
    command += ["--tokens", str(out / "tokens-0.pt"), "--init-head", str(out / "head")]
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    return {"out": out, "target": target, "rows": rows, "log": proc.stdout, "split_files": split_files,
            "vocab": vocab, "eos": tokenizer.eos_token_id, "resumed": resumed}


def test_the_run_exports_a_head_a_manifest_and_the_token_data(pipeline_run):
    out = pipeline_run["out"]
    assert pipeline_run["split_files"] == ["config.json", "lm_head.safetensors", "manifest.json", "model.safetensors"]
    assert sorted(p.name for p in (out / "head").iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    manifest = json.loads((out / "head" / "manifest.json").read_text())
    saved = torch.load(str(out / "tokens-0.pt"))
    assert len(saved["prompt_lengths"]) == manifest["data"]["sequences"] > BENCH
    # the token data round-trips: each saved sequence starts with its prompt's ids
    prompt_ids = {tuple(row["ids"]) for row in pipeline_run["rows"]}
    tokens, offset = (saved["tokens"].long() & 0xFFFF), 0
    for prompt_length, output_length in zip(saved["prompt_lengths"].tolist(), saved["output_lengths"].tolist()):
        assert tuple(tokens[offset:offset + prompt_length].tolist()) in prompt_ids
        offset += prompt_length + output_length
    assert offset == len(tokens)


def test_held_out_prompts_are_evaluated_never_trained(pipeline_run):
    manifest = json.loads((pipeline_run["out"] / "head" / "manifest.json").read_text())
    training = manifest["training"]
    assert training["bench_sequences"] == BENCH
    assert training["train_sequences"] + training["val_sequences"] + BENCH == manifest["data"]["sequences"]
    assert manifest["data"]["generated_train_tokens"] == manifest["vocabulary"]["counted_tokens"]


def test_the_learning_curve_is_recorded_for_both_heads(pipeline_run):
    manifest = json.loads((pipeline_run["out"] / "head" / "manifest.json").read_text())
    curve = manifest["learning_curve"]
    assert len(curve) >= 2 and curve[0]["step"] == 0 and curve[-1]["step"] == manifest["training"]["steps"] > 0
    assert [p["positions_seen"] for p in curve] == sorted(p["positions_seen"] for p in curve)
    for point in curve:
        assert [h["lr"] for h in point["heads"]] == [1e-3, 3e-3]
        for head in point["heads"]:
            for split in ("val", "bench"):
                rates, lengths = head[split]["top1_per_step"], head[split]["acceptance_length_by_k"]
                assert len(rates) == len(lengths) == 3 and all(0 <= r <= 1 for r in rates)
                # an acceptance length is 1 (the bonus token) plus at most K drafts, and grows with K
                assert all(1.0 <= a <= k + 1 for k, a in enumerate(lengths, 1)) and lengths == sorted(lengths)
    assert curve[-1]["heads"][0]["train_loss"] is not None
    assert manifest["training"]["chosen_lr"] in (1e-3, 3e-3)


def test_the_vocabulary_is_the_targets_most_frequent_tokens(pipeline_run):
    from safetensors.torch import load_file

    out = pipeline_run["out"]
    manifest = json.loads((out / "head" / "manifest.json").read_text())
    tensors = load_file(str(out / "head" / "model.safetensors"))
    draft_ids = torch.arange(DRAFT_VOCAB) + tensors["d2t"]
    assert bool((draft_ids[1:] > draft_ids[:-1]).all()) and pipeline_run["eos"] in draft_ids.tolist()
    assert int(tensors["t2d"].sum()) == DRAFT_VOCAB and bool(tensors["t2d"][draft_ids].all())
    coverage = manifest["vocabulary"]["coverage_by_size"]
    assert list(coverage.values()) == sorted(coverage.values())
    # every generated train token the vocabulary covers is counted in the recorded coverage
    saved = torch.load(str(out / "tokens-0.pt"))
    tokens, offset, produced = (saved["tokens"].long() & 0xFFFF), 0, []
    for prompt_length, output_length, split in zip(saved["prompt_lengths"].tolist(), saved["output_lengths"].tolist(),
                                                  saved["splits"]):
        if split != "bench":
            produced.append(tokens[offset + prompt_length:offset + prompt_length + output_length])
        offset += prompt_length + output_length
    produced = torch.cat(produced)
    covered = float(torch.isin(produced, draft_ids).float().mean())
    assert abs(covered - manifest["vocabulary"]["coverage_of_target_tokens"]) < 1e-3


def test_export_round_trips_through_the_trainer(pipeline_run):
    out = pipeline_run["out"] / "head"
    target_config = json.loads((pipeline_run["target"] / "config.json").read_text())
    target_config["_rope_theta"] = (target_config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    head = load_exported(out, target_config)
    again = checkpoint_tensors(head, target_config["vocab_size"])
    from safetensors.torch import load_file

    written = load_file(str(out / "model.safetensors"))
    assert set(again) == set(written)
    assert all(torch.equal(again[name], written[name]) for name in written)
    assert isinstance(head, Eagle3Head)


def test_a_run_resumes_from_an_earlier_runs_tokens_and_head(pipeline_run):
    from safetensors.torch import load_file

    first = json.loads((pipeline_run["out"] / "head" / "manifest.json").read_text())
    second = json.loads((pipeline_run["resumed"] / "head" / "manifest.json").read_text())
    assert second["data"]["reused_sequences"] == first["data"]["sequences"]
    assert second["data"]["initial_head"] and second["vocabulary"]["kept_from"] == "--init-head"
    # no prompt is answered twice: every saved sequence of the second run has a prompt of its own
    saved = torch.load(str(pipeline_run["resumed"] / "tokens-0.pt"))
    tokens, offset, prompts = (saved["tokens"].long() & 0xFFFF).tolist(), 0, []
    for prompt_length, output_length in zip(saved["prompt_lengths"].tolist(), saved["output_lengths"].tolist()):
        prompts.append(tuple(tokens[offset:offset + prompt_length]))
        offset += prompt_length + output_length
    assert len(prompts) == len(set(prompts)) == second["data"]["sequences"] <= PROMPTS + EXTRA
    assert second["data"]["sequences"] > first["data"]["sequences"]  # it went on with prompts not yet answered
    runs = (pipeline_run["out"], pipeline_run["resumed"])
    assert torch.equal(*[load_file(str(run / "head" / "model.safetensors"))["d2t"] for run in runs])


def test_training_on_from_a_head_starts_from_its_weights_not_the_targets(pipeline_run):
    import argparse

    from gpu_pipeline import Trainer, load_target

    args = argparse.Namespace(target=pipeline_run["target"], gguf=None, lrs="1e-3,3e-3")
    model, config = load_target(args, torch.device("cpu"))
    first = load_exported(pipeline_run["out"] / "head", config)
    trainer = Trainer(model, config, first.draft_to_target, args, torch.device("cpu"), start_head=first)
    fresh = Trainer(model, config, first.draft_to_target, args, torch.device("cpu"))
    for entry, new in zip(trainer.heads, fresh.heads):
        assert all(torch.equal(a, b) for a, b in zip(entry["head"].state_dict().values(), first.state_dict().values()))
        assert not torch.equal(new["head"].fc.weight, first.fc.weight)


LOADER_PROBE = r"""
hidden = model.config.hidden_size
probe = torch.randn(3, hidden, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    logits = model.compute_logits(probe)
draft_ids = torch.arange(len(checkpoint["d2t"])) + checkpoint["d2t"]
expected = probe @ checkpoint["lm_head.weight"].float().T
print("RESULT=" + json.dumps({
    "class": type(model).__name__,
    "argmax_is_mapped": logits.argmax(-1).tolist() == draft_ids[expected.argmax(-1)].tolist(),
    "logit_error": (logits[:, draft_ids] - expected).abs().max().item(),
}))
"""


@pytest.mark.vllm
def test_vllm_loads_the_exported_head(pipeline_run):
    """vLLM's EAGLE-3 loader reads the pipeline's export: a draft's argmax over the draft vocabulary
    comes back as the target id the trainer mapped it to."""
    found, _ = draft_loader.probe(pipeline_run["target"], pipeline_run["out"] / "head", "eagle3", LOADER_PROBE)
    assert found["class"] == "Eagle3LlamaForCausalLM"
    assert found["argmax_is_mapped"] and found["logit_error"] < 1e-3
