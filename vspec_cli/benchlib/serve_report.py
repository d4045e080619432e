"""Serve bench statistics, checks, markdown and plots (the offline bench's counterparts for live load).

Per load (a rate or the ramp) and policy: medians over rounds of output tok/s, request/s, TTFT, TPOT
and ITL (p50, p99), acceptance length and the K histogram over all its rounds, failed requests, and
how many greedy answers equal target-only's text. Paired ratios per round (vspec_cli/benchlib/
paired.py): output tok/s against target-only and against the *best baseline* (the better of
target-only and the best fixed K by geometric-mean tok/s), TPOT p50 against the baseline with the
lowest geometric-mean TPOT p50, and the same TPOT ratio request by request (below). The targets (issue
14): online >= 0.98x the best baseline in output tok/s, and its TPOT p50 within 3% of the best (checked
as best TPOT / online TPOT >= 1/1.03).

Why TPOT request by request as well: a load of 6-40 requests drawn from a pool of copy, code and chat
prompts has a median TPOT that jumps between prompt kinds from one policy's run to the next (a copy
answer's tokens come three times as fast as a chat answer's), so the ratio of two p50s is mostly that
draw, and three rounds gave intervals of +-13-30%. Every policy of a round sends the same requests at
the same times, so request i of one policy pairs with request i of another: a round's sample is the
geometric mean over its requests of best TPOT / own TPOT, and the interval is still the paired t over
rounds (requests of one round share the machine's state and are not independent samples). Measured
(docs/benchmarks.md, serve-8): it narrows TPOT intervals at light load, where requests seldom overlap;
under load a round's requests share one queue and rise and fall together, and only more rounds help.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from vspec_cli.benchlib import paired
from vspec_cli.benchlib.policies import BenchPolicy
from vspec_cli.benchlib.serve_driver import LoadRun

TARGET_ONLY = "target-only"
ONLINE = "online"
TOK_S_TARGET = 0.98
TPOT_TOLERANCE = 1.03
METRICS = ("output_tok_s", "request_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99")


def _median(values: list[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _by_round(runs: list[LoadRun], metric: str) -> dict[paired.Key, float]:
    return {(r.repeat, r.round): r.metrics[metric] for r in runs if r.metrics.get(metric)}


def _twins(runs: list[LoadRun], reference: list[LoadRun], field: str) -> Iterator[list[tuple[Any, Any]]]:
    """Per round both ran: (own, reference) per request of ``field`` (texts, tpots), in schedule order.

    Every policy of a round got the same arrivals and prompts, so request i of one is request i of the other.
    """
    theirs = {(r.repeat, r.round): getattr(r, field) for r in reference}
    for run in runs:
        other = theirs.get((run.repeat, run.round))
        if other is not None:
            yield list(zip(getattr(run, field), other))


def _per_request_tpot_logs(mine: list[LoadRun], reference: list[LoadRun]) -> list[float]:
    """Per round: the mean over requests both answered of log(reference TPOT / own TPOT)."""
    by_round = []
    for twins in _twins(mine, reference, "tpots"):
        logs = [math.log(other / own) for own, other in twins if own and other]
        if logs:
            by_round.append(statistics.fmean(logs))
    return by_round


def _acceptance_length(runs: list[LoadRun]) -> Optional[float]:
    drafts = sum(r.counters.get("vllm:spec_decode_num_drafts_total", 0.0) for r in runs)
    accepted = sum(r.counters.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) for r in runs)
    return 1 + accepted / drafts if drafts else None


def _k_histogram(runs: list[LoadRun]) -> dict[str, int]:
    histogram: dict[str, int] = {}
    for run in runs:
        for key, value in run.counters.items():
            if key.startswith("k"):
                histogram[key[1:]] = histogram.get(key[1:], 0) + int(value)
    return dict(sorted(histogram.items(), key=lambda kv: int(kv[0])))


def _same_as_target(runs: list[LoadRun], reference: list[LoadRun]) -> Optional[dict[str, int]]:
    compared = equal = 0
    for twins in _twins(runs, reference, "texts"):
        for mine, theirs in twins:
            if mine is not None and theirs is not None:
                compared += 1
                equal += mine == theirs
    return {"compared": compared, "equal": equal} if compared else None


def _best(rows: dict[str, list[LoadRun]], labels: list[str], metric: str, lowest: bool) -> Optional[str]:
    means = {label: paired.geometric_mean(_by_round(rows[label], metric)) for label in labels if rows.get(label)}
    means = {label: value for label, value in means.items() if value}
    if not means:
        return None
    return (min if lowest else max)(means, key=means.get)


def summarise(policies: list[BenchPolicy], loads: list[str], runs: list[LoadRun], greedy: bool) -> list[dict[str, Any]]:
    baselines = [p.label for p in policies if p.kind in ("target-only", "fixed")]
    cells = []
    for load in loads:
        rows = {p.label: [r for r in runs if r.load == load and r.policy == p.label] for p in policies}
        best = _best(rows, baselines, "output_tok_s", lowest=False)
        best_tpot = _best(rows, baselines, "tpot_p50", lowest=True)
        cell: dict[str, Any] = {"load": load, "best_baseline": best, "best_tpot_baseline": best_tpot, "policies": {}}
        for policy in policies:
            mine = rows[policy.label]
            row: dict[str, Any] = {metric: _median([r.metrics.get(metric) for r in mine]) for metric in METRICS}
            row.update(rounds=len(mine), failed=sum(r.metrics.get("failed", 0) for r in mine),
                       acceptance_length=_acceptance_length(mine), k_histogram=_k_histogram(mine))
            if greedy and TARGET_ONLY in rows and policy.label != TARGET_ONLY:
                row["same_as_target_only"] = _same_as_target(mine, rows[TARGET_ONLY])
            if TARGET_ONLY in rows and policy.label != TARGET_ONLY:
                row["paired_target_only"] = paired.paired_ratio(_by_round(mine, "output_tok_s"),
                                                                _by_round(rows[TARGET_ONLY], "output_tok_s"))
            if best and policy.label != best:
                row["paired_best"] = paired.paired_ratio(_by_round(mine, "output_tok_s"),
                                                         _by_round(rows[best], "output_tok_s"))
            if best_tpot and policy.label != best_tpot:
                # best's TPOT / mine: >= 1/1.03 means mine is within 3% of the best
                row["paired_tpot_vs_best"] = paired.paired_ratio(_by_round(rows[best_tpot], "tpot_p50"),
                                                                 _by_round(mine, "tpot_p50"))
                row["per_request_tpot_vs_best"] = paired.log_ratio_interval(
                    _per_request_tpot_logs(mine, rows[best_tpot]))
            cell["policies"][policy.label] = row
        cells.append(cell)
    return cells


def _verdict(interval: Optional[dict[str, Any]], threshold: float) -> str:
    """A check's verdict; "not measured" where no baseline ran or no request pairs with its twin."""
    return paired.verdict(interval, threshold) or "not measured"


def checks(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for cell in cells:
        row = cell["policies"].get(ONLINE)
        if row is None:
            continue
        tok = row.get("paired_best")
        found.append({"load": cell["load"], "check": f"online output tok/s >= {TOK_S_TARGET}x the best baseline",
                      "reference": cell["best_baseline"], "interval": tok,
                      "verdict": _verdict(tok, TOK_S_TARGET)})
        tpot = row.get("paired_tpot_vs_best")
        found.append({"load": cell["load"], "check": "online TPOT p50 within 3% of the best",
                      "reference": cell["best_tpot_baseline"], "interval": tpot,
                      "verdict": _verdict(tpot, 1 / TPOT_TOLERANCE)})
        per_request = row.get("per_request_tpot_vs_best")
        found.append({"load": cell["load"], "check": "online TPOT within 3% of the best, request by request",
                      "reference": cell["best_tpot_baseline"], "interval": per_request,
                      "verdict": _verdict(per_request, 1 / TPOT_TOLERANCE)})
    return found


# What a policy is pooled against over several runs of one load: (key, display name). TPOT reads as
# in the table: the best TPOT baseline's p50 over the policy's own (>= 1/1.03: within 3% of the best).
POOLED_REFERENCES = (("target_only", "x target-only"), ("best_baseline", "x best baseline"), ("online", "x online"),
                     ("best_tpot", "best TPOT / TPOT"))


def pooled_logs(cells: list[dict[str, Any]], runs: list[LoadRun]) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Per load, per (policy, reference): the paired log ratios of one run's rounds.

    The best baseline (and the best TPOT baseline) counts itself, at ratio 1, as the offline pooling
    does, so a policy that is the best in one run and not in the next still pools every run; a policy
    is not pooled against itself as target-only or online."""
    found: dict[str, dict[tuple[str, str], list[float]]] = {}
    for cell in cells:
        load = cell["load"]
        mine = {label: [r for r in runs if r.load == load and r.policy == label] for label in cell["policies"]}
        tok_s = {label: _by_round(group, "output_tok_s") for label, group in mine.items()}
        tpot = {label: _by_round(group, "tpot_p50") for label, group in mine.items()}
        references = {"target_only": (TARGET_ONLY, tok_s), "best_baseline": (cell.get("best_baseline"), tok_s),
                      "online": (ONLINE, tok_s), "best_tpot": (cell.get("best_tpot_baseline"), tpot)}
        for label in mine:
            for key, (reference, values) in references.items():
                if reference not in mine or (key in ("target_only", "online") and reference == label):
                    continue
                own, theirs = values[label], values[reference]
                logs = paired.paired_logs(theirs, own) if key == "best_tpot" else paired.paired_logs(own, theirs)
                if logs:
                    found.setdefault(load, {})[(label, key)] = logs
    return found


def pooled_over_runs(documents: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Several serve results.json of one command, per load: each policy's ratio to each reference over
    every run's rounds at once.

    The runs are repeats of one load, not cells with ratios of their own, so their pairs form one
    sample (a plain paired t over all rounds, paired.log_ratio_interval): what moves a run's ratio as a
    whole (the mix of prompts its windows served, the machine's level) is noise here, and widens the
    interval, where the offline pooling's strata would have left it out."""
    per_run: dict[str, dict[tuple[str, str], list[list[float]]]] = {}  # each run's logs, kept apart to count runs
    for document in documents:
        runs = [LoadRun(**record) for record in document["runs"]]
        for load, found in pooled_logs(document["cells"], runs).items():
            for key, logs in found.items():
                per_run.setdefault(load, {}).setdefault(key, []).append(logs)
    pooled: dict[str, list[dict[str, Any]]] = {}
    for load, found in per_run.items():
        for (label, reference), runs_logs in found.items():
            interval = paired.log_ratio_interval([log for logs in runs_logs for log in logs])
            if interval and interval.get("low") is not None:
                pooled.setdefault(load, []).append({"policy": label, "reference": reference,
                                                    "runs": len(runs_logs), **interval})
    return pooled


def pooled_lines(pooled: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per load and policy: its pooled ratios, each with its pairs and runs."""
    names = dict(POOLED_REFERENCES)
    lines = []
    for load, entries in pooled.items():
        by_policy: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in entries:
            by_policy.setdefault(entry["policy"], {})[entry["reference"]] = entry
        for policy, found in by_policy.items():
            parts = [f"{names[key]} {found[key]['ratio']:.3f}x [{found[key]['low']:.3f}-{found[key]['high']:.3f}]"
                     f" ({found[key]['pairs']} pairs, {_count(found[key]['runs'], 'run')})"
                     for key, _ in POOLED_REFERENCES if key in found]
            lines.append(f"{load}, {policy}: " + "; ".join(parts))
    return lines


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _fmt(value: Optional[float], scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _fmt_interval(interval: Optional[dict[str, Any]]) -> str:
    if not interval:
        return "-"
    if interval.get("low") is None:
        return f"{interval['ratio']:.2f}x"
    return f"{interval['ratio']:.2f}x [{interval['low']:.2f}-{interval['high']:.2f}]"


def _fmt_histogram(histogram: dict[str, int]) -> str:
    total = sum(histogram.values())
    if not total:
        return "-"
    return " ".join(f"{k}:{100 * v / total:.0f}%" for k, v in histogram.items() if v / total >= 0.01)


COLUMNS = ("load", "policy", "out tok/s", "req/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50/p99 ms",
           "x target-only", "x best", "best TPOT / TPOT", "same, per request", "accept len", "K histogram", "failed",
           "same text")


def table_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for cell in cells:
        for label, row in cell["policies"].items():
            same = row.get("same_as_target_only")
            rows.append([
                cell["load"], label, _fmt(row["output_tok_s"]), _fmt(row["request_s"], digits=2),
                f"{_fmt(row['ttft_p50'], 1000, 0)}/{_fmt(row['ttft_p99'], 1000, 0)}",
                f"{_fmt(row['tpot_p50'], 1000)}/{_fmt(row['tpot_p99'], 1000)}",
                f"{_fmt(row['itl_p50'], 1000)}/{_fmt(row['itl_p99'], 1000)}",
                _fmt_interval(row.get("paired_target_only")), _fmt_interval(row.get("paired_best")),
                _fmt_interval(row.get("paired_tpot_vs_best")), _fmt_interval(row.get("per_request_tpot_vs_best")),
                _fmt(row["acceptance_length"], digits=2), _fmt_histogram(row["k_histogram"]), str(row["failed"]),
                f"{same['equal']}/{same['compared']}" if same else "-",
            ])
    return rows


TERMINAL_COLUMNS = ("load", "policy", "tok/s", "TPOT ms", "TTFT ms", "x target-only", "x best", "TPOT best/own",
                    "per request", "accept", "mean K")


def _mean_k(histogram: dict[str, int]) -> Optional[float]:
    total = sum(histogram.values())
    return sum(int(k) * v for k, v in histogram.items()) / total if total else None


def terminal_rows(cells: list[dict[str, Any]]) -> list[list[str]]:
    """The table's essentials for an 80-column terminal; results.md has every column."""
    return [[cell["load"], label, _fmt(row["output_tok_s"]), _fmt(row["tpot_p50"], 1000),
             _fmt(row["ttft_p50"], 1000, 0), _fmt_interval(row.get("paired_target_only")),
             _fmt_interval(row.get("paired_best")), _fmt_interval(row.get("paired_tpot_vs_best")),
             _fmt_interval(row.get("per_request_tpot_vs_best")), _fmt(row["acceptance_length"], digits=2),
             _fmt(_mean_k(row["k_histogram"]), digits=1)]
            for cell in cells for label, row in cell["policies"].items()]


def checks_lines(found: list[dict[str, Any]]) -> list[str]:
    return [f"{c['load']}: {c['check']} (vs {c['reference']}): {c['verdict']} {_fmt_interval(c['interval'])}"
            for c in found]


def markdown(document: dict[str, Any]) -> str:
    s = document["settings"]
    lines = [
        "# vspec bench (serve driver)", "",
        f"Command: `{document['command']}`", "",
        f"Started {document['started']}, finished {document['finished']}. {s['target_model']} ({s['method']}, "
        f"K <= {s['gamma']}), {s['max_tokens']} new tokens per request, temperature {s['temperature']}, "
        f"{s['rounds']} rounds x {s['repeats']} repeats per load, {s['duration_s']} s of arrivals per load "
        f"(burstiness {s['burstiness']}), {s['prompts']} distinct {s['workload']} prompts, prefix caching on.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(document["cells"])]
    lines += ["", "Checks:", ""] + [f"- {line}" for line in checks_lines(document["checks"])]
    if any(load.get("clients") for load in s.get("loads", [])):
        lines += ["", "Closed loops ('N clients'): out tok/s counts the tokens streamed while the clients were "
                  "sending, over that time (the answers that drain after it are not counted); req/s is over the "
                  "makespan."]
    lines += ["", "Intervals: paired per round (t on log ratios, 95%); 'not resolved' when one straddles the target. "
              "'Same, per request': a round's sample is the geometric mean of best TPOT / own TPOT over the requests "
              "both answered (every policy of a round gets the same requests at the same times)."]
    return "\n".join(lines) + "\n"


def plot_rates(cells: list[dict[str, Any]], rates: dict[str, float], path: Path, title: str) -> Optional[Path]:
    """Output tok/s and TPOT p50 against the request rate, one line per policy."""
    from vspec_cli.benchlib.plots import pyplot

    rated = [c for c in cells if c["load"] in rates]
    if not rated:
        return None
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for label in rated[0]["policies"]:
        xs = [rates[c["load"]] for c in rated]
        top.plot(xs, [c["policies"][label]["output_tok_s"] for c in rated], marker="o", label=label)
        bottom.plot(xs, [(c["policies"][label]["tpot_p50"] or 0) * 1000 for c in rated], marker="o", label=label)
    top.set_ylabel("output tok/s")
    bottom.set_ylabel("TPOT p50 (ms)")
    bottom.set_xlabel("request rate (req/s)")
    top.set_title(title)
    top.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ramp(ramp_runs: list[LoadRun], trace: list[dict[str, Any]], shape, path: Path, title: str) -> Optional[Path]:
    """K over time during the ramp, per adaptive policy (first round of the first repeat), with the rate."""
    from vspec_cli.benchlib.plots import pyplot

    chosen = [r for r in ramp_runs if r.repeat == 0 and r.round == 0 and r.policy != TARGET_ONLY]
    series = []
    for run in chosen:
        steps = [(line["time"] - run.started_at, line["gamma"]) for line in trace
                 if run.started_at <= line.get("time", -1) <= run.ended_at and line.get("policy") == run.policy
                 and "gamma" in line]
        if steps:
            series.append((run.policy, steps))
    if not series:
        return None
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(8, 4))
    for label, steps in series:
        axis.step([t for t, _ in steps], [k for _, k in steps], where="post", label=label, alpha=0.8)
    axis.set_xlabel("seconds into the ramp")
    axis.set_ylabel("K")
    rate_axis = axis.twinx()
    times = [shape.duration_s * i / 100 for i in range(101)]
    rate_axis.plot(times, [shape.rate_at(t) for t in times], color="grey", linestyle="--", label="arrival rate")
    rate_axis.set_ylabel("arrival rate (req/s)")
    axis.set_title(title)
    axis.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
