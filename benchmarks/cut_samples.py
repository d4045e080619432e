"""Cut a serve bench's step samples by time: where each policy's engine time went.

Usage: .venv/bin/python benchmarks/cut_samples.py bench-out/serve-mixed8-cw [--json]

Reads a `vspec bench --driver serve ... --step-samples` run (its samples carry each step's completion
time, on the clock its loads were timed with) and, per policy, over the steps inside its own loads:

* **step classes**: admissions (a step that also prefilled a prompt), switches (a pure decode step
  that verified drafts made at another K) and stable steps, with each one's share of the engine's
  time and its tokens per second; and how a switch step's cost per token compares with the stable
  steps at the K it verified among the ten steps around it;
* **batch sizes**: the time share and tokens per second of the stable steps at the load's top batch
  size (eight clients: batch 8), of its other steps (admissions, switches), and of the steps at
  smaller batches (the clients' staggered start and the drain after the window): how much of a
  load is the steady state its name suggests;
* **decisions**: the share of time spent under each reason of the controller's trace (exploit,
  firm-up, explore, ...), as the decision before each step gave it, and the rate of the stable
  steps under it;
* **batch mix**: stable steps at the load's top batch size whose drafting requests are all known
  (a sample lists the requests that drafted in its step, so one with no proposal goes unseen), split
  by whether a copying answer drafted in the batch, with their rate and K histogram. A request's kind
  is the workload its prompt came from, through the bench's own seeded draw (`load.arrivals`), and a
  vLLM request id is matched to the client record whose answer completed nearest the last step it
  drafted in, within 0.3 s (about three in four match; a step with an unmatched request is left out).

docs/benchmarks.md ("Where online's loss goes, cut by time") reads three runs with it.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from vspec_cli.benchlib import load as loadlib
from vspec_cli.benchlib.serve_cli import prompt_pool
from vspec_cli.workloads import parse_workloads

MATCH_WITHIN_S = 0.3  # a client's done_at comes this soon after the engine step that finished it
COPY = "copy"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_in_loads(samples: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per policy: its samples that fall inside one of its own loads, in time order."""
    by_policy: dict[str, list[dict[str, Any]]] = defaultdict(list)
    windows = defaultdict(list)
    for run in runs:
        windows[run["policy"]].append((run["started_at"], run["ended_at"]))
    for sample in samples:
        label = sample.get("policy")
        if any(start <= sample["time"] <= end for start, end in windows.get(label, ())):
            by_policy[label].append(sample)
    return by_policy


def is_admission(sample: dict[str, Any]) -> bool:
    """More tokens in the step than a decode of the batch at its K could schedule: a prompt was in it."""
    return sample["batched_tokens"] > sample["batch_size"] * (sample["gamma"] + 1)


def rate(steps: list[dict[str, Any]]) -> float:
    elapsed = sum(s["interval_ms"] for s in steps)
    return 1000.0 * sum(s["committed"] for s in steps) / elapsed if elapsed else 0.0


def step_classes(steps: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(s["interval_ms"] for s in steps) or 1.0
    admissions = [s for s in steps if is_admission(s)]
    switches = [s for s in steps if not s["stable"] and not is_admission(s)]
    stable = [s for s in steps if s["stable"]]
    classes = {name: {"steps": len(group), "time_share": sum(s["interval_ms"] for s in group) / total,
                      "tok_s": rate(group)}
               for name, group in (("admission", admissions), ("switch", switches), ("stable", stable))}
    classes["switch"]["cost_vs_stable"] = _switch_cost(steps)
    return {"steps": len(steps), "seconds": total / 1000.0, "tok_s": rate(steps), "classes": classes}


def _switch_cost(steps: list[dict[str, Any]]) -> float | None:
    """Median, over switch steps, of their ms per token against the stable steps at the K they verified
    (same batch size) among the ten steps on either side."""
    ratios = []
    for index, sample in enumerate(steps):
        if sample["stable"] or is_admission(sample) or not sample["committed"]:
            continue
        near = [s["interval_ms"] / s["committed"] for s in steps[max(0, index - 10):index + 10]
                if s["stable"] and s["gamma"] == sample["gamma"] and s["batch_size"] == sample["batch_size"]
                and s["committed"]]
        if near:
            ratios.append(sample["interval_ms"] / sample["committed"] / statistics.fmean(near))
    return statistics.median(ratios) if ratios else None


def batch_sizes(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Time share and tok/s of stable top-batch steps, the top batch's other steps, and smaller batches."""
    top = max((s["batch_size"] for s in steps), default=0)
    total = sum(s["interval_ms"] for s in steps) or 1.0
    groups = {
        f"stable at batch {top}": [s for s in steps if s["batch_size"] == top and s["stable"]],
        f"other at batch {top}": [s for s in steps if s["batch_size"] == top and not s["stable"]],
        f"batch below {top}": [s for s in steps if s["batch_size"] < top],
    }
    return {name: {"steps": len(group), "time_share": sum(s["interval_ms"] for s in group) / total,
                   "tok_s": rate(group)}
            for name, group in groups.items()}


def decision_reasons(steps: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> dict[str, Any]:
    """Time under each decision reason (the latest traced decision before the step)."""
    times = [d["time"] for d in decisions]
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in steps:
        index = bisect.bisect_left(times, sample["time"]) - 1
        if index >= 0:
            groups[decisions[index]["reason"]].append(sample)
    total = sum(s["interval_ms"] for s in steps) or 1.0
    return {reason: {"steps": len(group), "time_share": sum(s["interval_ms"] for s in group) / total,
                     "stable_tok_s": rate([s for s in group if s["stable"]])}
            for reason, group in sorted(groups.items(), key=lambda kv: -len(kv[1]))}


def request_kinds(document: dict[str, Any], records: list[dict[str, Any]],
                  samples: list[dict[str, Any]]) -> dict[str, str]:
    """vLLM request id -> the workload its prompt came from (module docstring)."""
    workloads = parse_workloads(document["settings"]["workload"].replace("+", ","))
    kind_of_prompt: dict[str, str] = {}
    for workload in workloads:
        for phase in workload.phase_plan(1, workload.size):
            for prompt in phase.prompts:
                kind_of_prompt.setdefault(prompt, workload.name)
    _, prompts = prompt_pool(workloads)
    loads = document["settings"]["loads"]
    load_indexes = {load["label"]: index for index, load in enumerate(loads)}
    last_seen: dict[str, tuple[float, str]] = {}
    for sample in samples:
        for request_id in sample["request_ids"]:
            last_seen[request_id] = (sample["time"], sample.get("policy", ""))
    kinds: dict[str, str] = {}
    for record in records:
        load_index = load_indexes[record["load"]]
        shape = loadlib.LoadShape(**{k: v for k, v in loads[load_index].items() if k != "label"})
        schedule = loadlib.arrivals(shape, prompts, seed=1000 * load_index + record["round"])
        candidates = sorted((seen, request_id) for request_id, (seen, label) in last_seen.items()
                            if label == record["policy"] and request_id not in kinds)
        for request in record["requests"]:
            if not request.get("ok") or request["index"] >= len(schedule):
                continue
            done = request["done_at"]
            at = bisect.bisect_left(candidates, (done, ""))
            near = range(max(0, at - 8), min(len(candidates), at + 8))
            best = min(near, key=lambda i: abs(candidates[i][0] - done), default=None)
            if best is not None and abs(candidates[best][0] - done) <= MATCH_WITHIN_S:
                kinds[candidates.pop(best)[1]] = kind_of_prompt[schedule[request["index"]].prompt]
    return kinds


def batch_mix(steps: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, Any]:
    top = max((s["batch_size"] for s in steps), default=0)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in steps:
        if not sample["stable"] or sample["batch_size"] != top or not sample["request_ids"]:
            continue
        found = [kinds.get(request_id) for request_id in sample["request_ids"]]
        if None not in found:
            groups["with a copying answer" if COPY in found else "no copying answer"].append(sample)
    return {"batch_size": top, **{name: {"steps": len(group), "tok_s": rate(group),
                                         "k": dict(sorted(Counter(s["gamma"] for s in group).items()))}
                                  for name, group in sorted(groups.items())}}


def cut(folder: Path) -> dict[str, Any]:
    document = json.loads((folder / "results.json").read_text())
    if document.get("driver") != "serve":
        raise ValueError("not a serve-driver run (vspec bench --driver serve)")
    report: dict[str, Any] = {}
    for repeat in range(document["settings"]["repeats"]):
        samples_file = folder / "traces" / f"vspec-r{repeat + 1}.samples.jsonl"
        if not samples_file.is_file():
            raise ValueError(f"no step samples in {samples_file.parent} (run the bench with --step-samples)")
        samples = read_jsonl(samples_file)
        if samples and "time" not in samples[0]:
            raise ValueError("these step samples carry no time (recorded before samples were timed)")
        runs = [run for run in document["runs"] if run["repeat"] == repeat]
        decisions = [d for d in read_jsonl(folder / "traces" / f"vspec-r{repeat + 1}.jsonl") if "reason" in d]
        records = read_jsonl(folder / "requests" / f"r{repeat + 1}.jsonl")
        kinds = request_kinds(document, records, samples)
        for label, steps in steps_in_loads(samples, runs).items():
            mine = [d for d in decisions if d.get("policy") == label]
            report[f"{label} (repeat {repeat + 1})"] = {
                **step_classes(steps),
                "batch_sizes": batch_sizes(steps),
                "decisions": decision_reasons(steps, mine) if mine else {},
                "batch_mix": batch_mix(steps, kinds),
            }
    return report


def lines(report: dict[str, Any]) -> list[str]:
    out = []
    for label, found in report.items():
        classes = found["classes"]
        out.append(f"{label}: {found['steps']} steps, {found['seconds']:.1f} s, {found['tok_s']:.1f} tok/s")
        parts = [f"{name} {c['time_share']:.1%} of time at {c['tok_s']:.1f} tok/s" for name, c in classes.items()]
        cost = classes["switch"]["cost_vs_stable"]
        out.append("  steps: " + "; ".join(parts)
                   + ("" if cost is None else f"; a switch costs {cost:.2f}x a stable step per token"))
        out.append("  batch sizes: " + "; ".join(f"{name} {g['time_share']:.1%} of time at {g['tok_s']:.1f} tok/s"
                                                 for name, g in found["batch_sizes"].items()))
        if found["decisions"]:
            out.append("  decisions: " + "; ".join(f"{reason} {d['time_share']:.1%} (stable {d['stable_tok_s']:.1f} tok/s)"
                                                   for reason, d in found["decisions"].items()))
        mix = found["batch_mix"]
        for name in ("no copying answer", "with a copying answer"):
            if name in mix:
                group = mix[name]
                out.append(f"  batch {mix['batch_size']}, {name}: {group['steps']} stable steps at {group['tok_s']:.1f} "
                           f"tok/s, K {group['k']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a serve bench's output folder (--out)")
    parser.add_argument("--json", action="store_true", help="print the cut as JSON")
    args = parser.parse_args()
    try:
        report = cut(args.folder)
    except (OSError, ValueError, KeyError) as error:
        sys.exit(f"cannot cut {args.folder}: {error}")
    print(json.dumps(report, indent=2) if args.json else "\n".join(lines(report)))


if __name__ == "__main__":
    main()
