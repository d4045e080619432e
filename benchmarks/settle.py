"""Where does the online controller settle on the demo model? (issue 3's SmolLM2 check)

Two runs, each one engine (vspec_cli.offline_run):
  1. ngram drafting on copy-heavy prompts: acceptance is high, K should settle high;
  2. a useless drafter (SmolLM2 truncated to its first 8 layers, as a draft model): K should settle
     at its minimum.
Prints the K histogram, mean K and vLLM's acceptance counters for each, as JSON and a table.

    .venv/bin/python benchmarks/settle.py [--out bench-out/settle]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPY_PROMPTS = [
    "Copy the following text exactly, word for word:\n\n" + text
    for text in [
        "Permission is hereby granted, free of charge, to any person obtaining a copy of this software and "
        "associated documentation files (the Software), to deal in the Software without restriction, including "
        "without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell "
        "copies of the Software, and to permit persons to whom the Software is furnished to do so.",
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick "
        "daft zebras jump. The five boxing wizards jump quickly. Sphinx of black quartz, judge my vow.",
    ]
]
CHAT_PROMPTS = ["Why is the sky blue?", "Give me three ideas for a birthday party."]


def truncated_drafter(demo: Path, target: Path, layers: int = 8) -> Path:
    if (target / "config.json").exists():
        return target
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_truncated_copy

    return build_truncated_copy(target, demo, layers)


def run(request: dict, out: Path, name: str) -> dict:
    request_file, result_file = out / f"{name}.request.json", out / f"{name}.result.json"
    request_file.write_text(json.dumps(request))
    subprocess.run([sys.executable, "-m", "vspec_cli.offline_run", str(request_file), str(result_file)],
                   check=True, cwd=REPO, stderr=open(out / f"{name}.log", "w"))
    return json.loads(result_file.read_text())


def spec(method: str, drafter: str | None, min_gamma: int, trace: Path) -> dict:
    return {"method": method, "target_model": "demo", "drafter": drafter, "gamma": 6,
            "adaptive": {"enabled": True, "policy": "online", "min_gamma": min_gamma, "trace": str(trace)},
            "serving": {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.3,
                        "max_num_seqs": 16, "device": "cpu"}}


def summarise(name: str, result: dict) -> dict:
    counters = result["counters"]
    drafts = counters["vllm:spec_decode_num_drafts"] or 1
    selections = {int(k): v for k, v in result["controller"]["selections"].items()}
    total = sum(selections.values()) or 1
    last = [line["gamma"] for line in (result["trace"] or [])][-20:]
    return {
        "run": name,
        "selections": selections,
        "mean_k": round(sum(k * n for k, n in selections.items()) / total, 2),
        "final_k": result["controller"]["gamma"],
        "last_decisions": last,
        "acceptance_length": round(1 + counters["vllm:spec_decode_num_accepted_tokens"] / drafts, 3),
        "tokens_per_s": round(sum(p["output_tokens"] for p in result["phases"]) /
                              sum(p["elapsed_s"] for p in result["phases"]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-out/settle")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from vspec_cli.demo_model import build_demo_model
    from vspec_runtime import paths

    demo = build_demo_model(paths.model_dir() / "demo")
    drafter = truncated_drafter(demo, out / "smollm2-8-layers")
    phases = lambda prompts: [{"name": f"p{i}", "prompts": [p], "max_tokens": args.max_tokens}  # noqa: E731
                              for i, p in enumerate(prompts)]
    results = [
        summarise("ngram-copy", run({"spec": spec("ngram", None, 0, out / "ngram.trace.jsonl"), "target_path": str(demo),
                                     "phases": phases(COPY_PROMPTS)}, out, "ngram-copy")),
        summarise("useless-draft-chat", run({"spec": spec("draft", str(drafter), 0, out / "draft.trace.jsonl"),
                                             "target_path": str(demo), "drafter_path": str(drafter),
                                             "phases": phases(CHAT_PROMPTS)}, out, "useless-draft")),
    ]
    (out / "settle.json").write_text(json.dumps(results, indent=2))
    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
