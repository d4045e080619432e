"""Per-cell statistics from the engine runs: throughput, ratios, acceptance, K histogram, equality.

Definitions (also in docs/benchmarks.md):
- tok/s of one run in a cell = output tokens of the cell's phases / their summed generate() time;
  the cell reports the median over repeats and the spread (min, max).
- ratio to target-only = median tok/s / target-only's median tok/s in the same cell.
- ratio to best fixed = median tok/s / the highest median among the fixed:K policies in the cell.
- ratio to online = median tok/s / the online policy's median in the cell (when online ran).
- acceptance length = 1 + accepted / drafts, from vLLM's counters summed over the cell and repeats.
- K histogram = the controller's selections (scheduled steps per K) in the cell, adaptive policies.
- equality: each sequence compared token for token with target-only's in the same repeat (target-only
  itself with its first repeat); mismatch rate = differing sequences / compared sequences. Greedy
  runs only: sampled runs draw differently with and without drafts, whatever the distribution.
- paired ratios (``paired_*``): per round, tok/s of the policy / tok/s of the reference in the same
  repeat and round, geometric mean with a 95% interval (vspec_cli/benchlib/paired.py says how and
  why); the best fixed K is the ``fixed:K`` with the highest geometric-mean tok/s over the rounds.
- phase oracle (cells with several phases per round, ``mixed``): per round, each phase at the fastest
  of target-only and the fixed Ks, paired against the best fixed K: the most a per-phase K could
  gain (vspec_cli/benchlib/headroom.py).
- quality (sampled runs): mean target log-probability per generated token (per sequence, then
  averaged), and its gap to target-only's on the same prompts and seeds.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Optional

from vspec_cli.benchlib import headroom, paired
from vspec_cli.benchlib.policies import BenchPolicy
from vspec_cli.benchlib.runner import Cell, EngineRun, phase_round

TARGET_ONLY = "target-only"
ONLINE = "online"
# The targets the product is held to (issues 4 and 6); reported per cell, never enforced.
# (reference, threshold, only on this workload, only for this policy kind, name)
CHECKS = (
    ("best_fixed", 0.98, None, None, "x best fixed K >= 0.98"),
    ("best_fixed", 1.10, "mixed", None, "x best fixed K >= 1.10 on mixed"),
    ("target_only", 0.97, None, None, "x target-only >= 0.97"),
    ("online", 0.98, None, "profile", "x online >= 0.98"),  # a profile should cost nothing against learning
)


def _ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    if value is None or not reference:
        return None
    return value / reference


def summarise(policies: list[BenchPolicy], cells: list[Cell], runs: list[EngineRun]) -> list[dict[str, Any]]:
    ok_runs = [run for run in runs if run.ok]
    reference = _reference_outputs(ok_runs)
    summaries = []
    for cell in cells:
        rows: dict[str, dict[str, Any]] = {}
        for policy in policies:
            rows[policy.label] = _policy_cell(policy, cell, [r for r in ok_runs if r.policy == policy.label], reference)
        target = rows.get(TARGET_ONLY, {}).get("tok_s_median")
        fixed = {label: row["tok_s_median"] for label, row in rows.items()
                 if label.startswith("fixed:") and row["tok_s_median"] is not None}
        best_fixed = max(fixed, key=fixed.get) if fixed else None
        online = rows.get(ONLINE, {}).get("tok_s_median")
        for row in rows.values():
            row["ratio_target_only"] = _ratio(row["tok_s_median"], target)
            row["ratio_best_fixed"] = _ratio(row["tok_s_median"], fixed.get(best_fixed) if best_fixed else None)
            row["ratio_online"] = _ratio(row["tok_s_median"], online)
        runs_by_label = {p.label: [r for r in ok_runs if r.policy == p.label] for p in policies}
        best_fixed = _paired_columns(rows, runs_by_label, cell) or best_fixed
        _quality_gaps(rows)
        summaries.append({"cell": cell.key, "workload": cell.workload.name, "batch": cell.batch,
                          "phases": len(cell.phases), "best_fixed": best_fixed, "policies": rows,
                          "phase_oracle": headroom.phase_oracle(runs_by_label, cell.key, best_fixed)})
    return summaries


def round_rates(runs: list[EngineRun], cell_key: str) -> dict[paired.Key, float]:
    """tok/s per (repeat, round) of one policy in one cell: the round's tokens / its generate() time."""
    tokens: Counter = Counter()
    elapsed: Counter = Counter()
    for run in runs:
        for phase in run.phases:
            if phase["cell"] == cell_key:
                key = (run.repeat, phase_round(phase))
                tokens[key] += phase["output_tokens"]
                elapsed[key] += phase["elapsed_s"]
    return {key: tokens[key] / elapsed[key] for key in tokens if elapsed[key] > 0}


# The references a policy is pooled against over all cells: (results key, display name).
POOLED_REFERENCES = (("target_only", "x target-only"), ("best_fixed", "x best fixed K"), ("online", "x online"))


def pooled_logs(summaries: list[dict[str, Any]], runs: list[EngineRun]) -> dict[tuple[str, str], list[list[float]]]:
    """Per (policy, reference): each cell's paired log ratios, one list per cell.

    References: target-only, the cell's best fixed K (itself included, at ratio 1) and online. A
    policy is not pooled against itself as target-only or online.
    """
    ok_runs = [run for run in runs if run.ok]
    labels = list(dict.fromkeys(run.policy for run in ok_runs))
    strata: dict[tuple[str, str], list[list[float]]] = {}
    for cell in summaries:
        rates = {label: round_rates([r for r in ok_runs if r.policy == label], cell["cell"]) for label in labels}
        named = {"target_only": TARGET_ONLY, "best_fixed": cell.get("best_fixed"), "online": ONLINE}
        for label in labels:
            for key, reference in named.items():
                if reference is None or reference not in rates or (key != "best_fixed" and reference == label):
                    continue
                logs = paired.paired_logs(rates[label], rates[reference])
                if logs:
                    strata.setdefault((label, key), []).append(logs)
    return strata


def pooled(summaries: list[dict[str, Any]], runs: list[EngineRun]) -> list[dict[str, Any]]:
    """Each policy's ratio to each reference over every cell at once (paired.stratified_interval).

    One cell resolves a few percent; a controller change worth 1% shows only over many cells' rounds
    together. Empty when the bench had a single cell (the cell's own interval says it all).
    """
    if len(summaries) < 2:
        return []
    return pooled_intervals(pooled_logs(summaries, runs))


def pooled_intervals(strata: dict[tuple[str, str], list[list[float]]]) -> list[dict[str, Any]]:
    """``pooled_logs`` (of one run, or several added together) -> one interval per policy and reference."""
    found = []
    for (label, reference), cells in strata.items():
        interval = paired.stratified_interval(cells)
        if interval:
            found.append({"policy": label, "reference": reference, **interval})
    return found


def _paired_columns(rows: dict[str, dict[str, Any]], runs_by_label: dict[str, list[EngineRun]],
                    cell: Cell) -> Optional[str]:
    """Adds paired_target_only / paired_best_fixed / paired_online to each row; returns the best fixed."""
    rates = {label: round_rates(runs, cell.key) for label, runs in runs_by_label.items()}
    means = {label: paired.geometric_mean(r) for label, r in rates.items() if label.startswith("fixed:") and r}
    means = {label: m for label, m in means.items() if m}
    best_fixed = max(means, key=means.get) if means else None
    for label, row in rows.items():
        mine = rates.get(label, {})
        row["paired_target_only"] = paired.paired_ratio(mine, rates[TARGET_ONLY]) if TARGET_ONLY in rates else None
        row["paired_best_fixed"] = paired.paired_ratio(mine, rates[best_fixed]) if best_fixed else None
        row["paired_online"] = paired.paired_ratio(mine, rates[ONLINE]) if ONLINE in rates else None
    return best_fixed


def _quality_gaps(rows: dict[str, dict[str, Any]]) -> None:
    """Gap of each policy's mean log-probability per token to target-only's, with its standard error
    (Welch: the sequences of the two policies are independent samples)."""
    target = rows.get(TARGET_ONLY, {})
    reference = target.get("mean_logprob")
    for label, row in rows.items():
        mine = row.get("mean_logprob")
        row["logprob_gap"] = None if mine is None or reference is None else mine - reference
        row["logprob_gap_se"] = None
        if label != TARGET_ONLY and row["logprob_gap"] is not None and row.get("logprob_sd") is not None \
                and target.get("logprob_sd") is not None:
            row["logprob_gap_se"] = (row["logprob_sd"] ** 2 / row["logprob_sequences"]
                                     + target["logprob_sd"] ** 2 / target["logprob_sequences"]) ** 0.5


def _reference_outputs(runs: list[EngineRun]) -> dict[int, list[list[list[int]]]]:
    """Target-only outputs by repeat; key -1 holds the first one (target-only's own reference)."""
    by_repeat = {run.repeat: run.outputs for run in runs if run.policy == TARGET_ONLY}
    if by_repeat:
        by_repeat[-1] = by_repeat[min(by_repeat)]
    return by_repeat


def _policy_cell(policy: BenchPolicy, cell: Cell, runs: list[EngineRun],
                 reference: dict[int, list[list[list[int]]]]) -> dict[str, Any]:
    sampled = any("mean_logprobs" in phase for run in runs for phase in run.phases)
    rates, tokens = [], 0
    drafts = accepted = 0.0
    histogram: Counter = Counter()
    compared = mismatched = 0
    sequence_logprobs: list[float] = []
    for run in sorted(runs, key=lambda r: r.repeat):
        indices = [i for i, phase in enumerate(run.phases) if phase["cell"] == cell.key]
        cell_tokens = sum(run.phases[i]["output_tokens"] for i in indices)
        elapsed = sum(run.phases[i]["elapsed_s"] for i in indices)
        if elapsed > 0:
            rates.append(cell_tokens / elapsed)
        tokens += cell_tokens
        for i in indices:
            counters = run.phases[i]["counters"]
            drafts += counters.get("vllm:spec_decode_num_drafts", 0.0)
            accepted += counters.get("vllm:spec_decode_num_accepted_tokens", 0.0)
            histogram.update({int(k): v for k, v in run.phases[i]["selections"].items()})
            sequence_logprobs += run.phases[i].get("mean_logprobs", [])
        ref = reference.get(-1 if policy.label == TARGET_ONLY else run.repeat)
        if ref is not None and not sampled:
            for i in indices:
                for mine, theirs in zip(run.outputs[i], ref[i]):
                    compared += 1
                    mismatched += mine != theirs
    mismatch_rate = mismatched / compared if compared else None
    median = statistics.median(rates) if rates else None
    return {
        "repeats": len(rates),
        "tok_s_median": median,
        "tok_s_min": min(rates) if rates else None,
        "tok_s_max": max(rates) if rates else None,
        "tok_s_runs": rates,
        "spread_pct": (max(rates) - min(rates)) / median * 100 if rates and median else None,
        "output_tokens": tokens,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "drafts": drafts,
        "accepted_tokens": accepted,
        "k_fixed": policy.gamma if policy.kind == "fixed" else None,
        "k_histogram": {str(k): v for k, v in sorted(histogram.items())} if histogram else None,
        "sequences_compared": compared,
        "mismatch_rate": mismatch_rate,
        "matches_target_only": None if mismatch_rate is None else mismatch_rate == 0.0,
        "mean_logprob": statistics.fmean(sequence_logprobs) if sequence_logprobs else None,
        "logprob_sequences": len(sequence_logprobs),
        "logprob_sd": statistics.stdev(sequence_logprobs) if len(sequence_logprobs) > 1 else None,
    }


def checks(policies: list[BenchPolicy], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where each adaptive policy stands against the product targets, cell by cell.

    A target whose reference did not run at all (no ``fixed:K`` in a K=0 bench) is left out rather
    than reported as "not measured" in every cell."""
    labels = [p.label for p in policies]
    ran = {"best_fixed": any(label.startswith("fixed:") for label in labels),
           "target_only": TARGET_ONLY in labels, "online": ONLINE in labels}
    found = []
    for policy in (p for p in policies if p.adaptive):
        for cell in summaries:
            row = cell["policies"][policy.label]
            for reference, threshold, only_workload, only_kind, name in CHECKS:
                if (only_workload and cell["workload"] != only_workload) or (only_kind and policy.kind != only_kind):
                    continue
                if not ran[reference]:
                    continue
                interval = row.get(f"paired_{reference}")
                value = interval["ratio"] if interval else row[f"ratio_{reference}"]
                found_verdict = paired.verdict(interval, threshold)
                check = {"policy": policy.label, "cell": cell["cell"], "check": name, "threshold": threshold,
                         "value": value, "low": interval and interval["low"], "high": interval and interval["high"],
                         "verdict": found_verdict, "ok": _as_ok(found_verdict)}
                if only_workload == "mixed" and cell.get("phase_oracle"):
                    oracle = cell["phase_oracle"]
                    check["headroom"] = {key: oracle[key] for key in ("ratio", "low", "high")}
                    # False: even the hindsight per-phase K stays below the target in this run.
                    check["reachable"] = _as_ok(paired.verdict(oracle, threshold))
                found.append(check)
    return found


def _as_ok(verdict: Optional[str]) -> Optional[bool]:
    """'met' -> True, 'missed' -> False, not resolved or not measured -> None."""
    return {"met": True, "missed": False}.get(verdict or "")
