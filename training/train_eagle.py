"""Train an EAGLE-1 head for SmolLM2-135M-Instruct (the CPU demo's target) on this machine.

    .venv/bin/python training/train_eagle.py --work bench-out/eagle-train --out drafters/smollm2-eagle

Stages (each resumes from its files in --work; `--stages` picks some):
  generate  SmolLM2 answers a seeded, varied prompt set greedily in vLLM (self-distillation data)
  features  the target's last hidden states (after the final norm, as vLLM hands them to the head)
  train     fc + one Llama decoder layer, initialised from the target's last layer; loss: the target's
            full next-token distribution (KL) plus feature regression, over 3 chained draft steps with
            the attention pattern vLLM's drafting really has (training-time test)
  export    fp16 safetensors in the layout vLLM's `eagle` method loads for Llama targets (no embedding,
            no LM head: both are shared with the target), config.json and manifest.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

STAGES = ("generate", "features", "train", "export")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo", help="target model: a vspec model name or a folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench-out" / "eagle-train")
    parser.add_argument("--out", type=Path, default=REPO / "drafters" / "smollm2-eagle")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--prompts", type=int, default=1400, help="chat prompts (HumanEval's 164 are added)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=8e-4)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=1, help="decoder layers in the head (vLLM runs any number)")
    parser.add_argument("--steps-ahead", type=int, default=3, help="draft steps chained in training")
    parser.add_argument("--time-budget-min", type=float, default=30.0, help="stop training after this long")
    parser.add_argument("--resume", action="store_true", help="train on from --work's head.pt (a new schedule)")
    args = parser.parse_args(argv)
    args.argv = list(argv)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        parser.error(f"--stages: unknown {sorted(unknown)}; choose from {', '.join(STAGES)}")
    return args


def target_dir(name: str) -> Path:
    from vspec_cli import model_store

    return model_store.require_local(name, "target")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    target = target_dir(args.target)
    log = {"target": str(target), "args": {k: str(v) for k, v in vars(args).items()}}
    generations = args.work / "generations.jsonl"
    if "generate" in stages:
        import prompts
        from generate import generate

        started = time.perf_counter()
        prompt_list = prompts.build(args.prompts, args.seed)
        generate(target, prompt_list, generations, args.max_tokens)
        log["generate_s"] = round(time.perf_counter() - started, 1)
    if "features" in stages:
        from features import extract

        started = time.perf_counter()
        extract(target, generations, args.work / "features.pt")
        log["features_s"] = round(time.perf_counter() - started, 1)
    if "train" in stages:
        from head import train

        train(target, args.work / "features.pt", args.work, args)
    if "export" in stages:
        from head import export

        export(target, args.work, args.out, args)
    (args.work / f"run-{int(time.time())}.json").write_text(json.dumps(log, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
