"""The GPU pipeline's self-written questions (`training/gpu_pipeline.py --questions`): the demo model
continues few-shot question lists from `training/prompts.py`, and what it writes becomes new chat
prompts. Run here with the real demo model on the CPU at a tiny scale, the code the device runs.

What a user of the trained head would notice if this broke: questions that are not questions (the
head learns from junk prompts), prompts that are not in the target's chat format (it learns the wrong
context), or the bench's held-out questions leaking into training (its measured acceptance would be
flattered).
"""

from __future__ import annotations

import argparse
import sys

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "training"))

import gpu_pipeline  # noqa: E402
import prompts as training_prompts  # noqa: E402

from vspec_cli.workloads import CHAT_QUESTIONS  # noqa: E402


@pytest.fixture(scope="module")
def demo(demo_model_dir):
    """The demo target and its tokenizer in transformers, as the pipeline loads them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    return AutoModelForCausalLM.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval(), tokenizer


def test_only_the_first_line_and_only_a_question_is_kept():
    assert gpu_pipeline.question_from(" How do tides work?\n7. Why do cats purr?") == "How do tides work?"
    assert gpu_pipeline.question_from(" Tides are caused by the moon.\n") is None
    assert gpu_pipeline.question_from(" Why?") is None  # too short to be a prompt
    assert gpu_pipeline.question_from(" 7. How do tides work?") is None  # the list numbering leaked in


def test_a_paraphrase_of_a_held_out_question_is_refused_a_new_one_is_not():
    held_out = [gpu_pipeline.words(q) for q in CHAT_QUESTIONS]
    assert "Why is sleep important for health?" in CHAT_QUESTIONS
    assert gpu_pipeline.near("Why is sleep so important for our health?", held_out)
    assert not gpu_pipeline.near("How do I fix a flat bicycle tyre at home?", held_out)


def test_the_seed_questions_are_not_the_bench_questions():
    held_out = [gpu_pipeline.words(q) for q in CHAT_QUESTIONS]
    assert not [q for q in training_prompts.QUESTION_SEEDS if gpu_pipeline.near(q, held_out)]


def test_the_demo_model_writes_new_questions_in_its_chat_format(demo):
    model, tokenizer = demo
    lists = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in training_prompts.question_prompts(16, 0)]
    spec = {"question_prompts": lists, "held_out_questions": list(CHAT_QUESTIONS),
            "question_seeds": list(training_prompts.QUESTION_SEEDS)}
    args = argparse.Namespace(questions=6, batch_seqs=12, seed=0)
    pad = tokenizer.eos_token_id
    rows = gpu_pipeline.write_questions(model, tokenizer, spec, args, float("inf"), torch.device("cpu"), pad)

    assert len(rows) == 6
    questions = [row["question"] for row in rows]
    assert len({q.lower() for q in questions}) == 6
    assert all(q.endswith("?") and "\n" not in q for q in questions)
    assert not set(questions) & set(CHAT_QUESTIONS) and not set(questions) & set(training_prompts.QUESTION_SEEDS)
    for row in rows:
        assert (row["split"], row["kind"]) == ("train", "self")
        expected = tokenizer.apply_chat_template([{"role": "user", "content": row["question"]}], tokenize=False,
                                                 add_generation_prompt=True)
        assert tokenizer.decode(row["ids"]) == expected
        assert expected.endswith(f"{row['question']}<|im_end|>\n<|im_start|>assistant\n")


def test_the_targets_own_questions_are_answered_before_the_template_prompts(demo):
    """A resumed run has answered most template prompts already: its generation time goes to the new
    questions first, and the held-out bench prompts still come before everything."""
    model, tokenizer = demo

    def prompt(text: str, split: str, kind: str) -> dict:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return {"ids": tokenizer(rendered, add_special_tokens=False)["input_ids"], "split": split, "kind": kind}

    template = [prompt(f"Explain topic number {i} in simple terms.", "train", "chat") for i in range(4)]
    own = [prompt("How do I fix a flat bicycle tyre?", "train", "self"),
           prompt("Why do owls hunt at night?", "train", "self")]
    bench = [prompt(CHAT_QUESTIONS[0], "bench", "chat")]
    args = argparse.Namespace(seed=0, batch_seqs=3, max_new_tokens=4)
    rows = gpu_pipeline.generate(model, template + own + bench, args, float("inf"), torch.device("cpu"),
                                 [tokenizer.eos_token_id], tokenizer.eos_token_id)

    assert [(row["split"], row["kind"]) for row in rows[:3]] == [("bench", "chat"), ("train", "self"), ("train", "self")]
    assert len(rows) == 7 and all(row["output"] for row in rows)


def test_a_prompts_file_without_question_lists_is_refused_before_the_target_loads(tmp_path):
    """An older prompts file (made before --questions existed) must fail at once with what to do, not
    after minutes of device time with a KeyError."""
    import gzip
    import json

    prompts = tmp_path / "old-prompts.json.gz"
    with gzip.open(prompts, "wt", encoding="utf-8") as handle:
        json.dump({"version": "old", "prompts": [], "eos_token_ids": [2], "pad_token_id": 2}, handle)
    with pytest.raises(SystemExit) as refused:
        gpu_pipeline.main(["--target", str(tmp_path / "no-model-here"), "--prompts", str(prompts), "--out",
                           str(tmp_path / "out"), "--questions", "8", "--tokenizer", str(tmp_path), "--device", "cpu"])
    assert "no few-shot question lists" in str(refused.value) and "training/prompts.py --ids-out" in str(refused.value)
