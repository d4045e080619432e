"""One bench session end to end: run the engines, summarise, plot, write results.json and results.md.

Returns the results document; rendering it (terminal table or --json) is the CLI's job.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from vspec_cli.benchlib import plots, report, stats
from vspec_cli.benchlib.interleave import run_interleaved
from vspec_cli.benchlib.runner import BenchPlan, Event, run_bench
from vspec_cli.atomic import write_text_atomic


from vspec_cli.benchlib.interleave import SETTLE_AFTER_SWITCH_S  # noqa: E402 - grouped with the report's inputs
from vspec_cli.workloads import PROMPT_SET_VERSION  # noqa: E402


def settings_of(plan: BenchPlan, rounds: int, batches: list[int]) -> dict[str, Any]:
    spec = plan.base_spec
    return {
        "target_model": spec.target_model, "target_path": plan.target_path, "drafter": spec.drafter,
        "method": spec.method, "gamma": spec.gamma, "dtype": spec.serving.dtype,
        "max_num_seqs": spec.serving.max_num_seqs, "policies": [p.label for p in plan.policies],
        "workloads": list(dict.fromkeys(c.workload.name for c in plan.cells)),
        "batches": batches, "rounds": rounds, "repeats": plan.repeats, "max_tokens": plan.max_tokens,
        "ignore_eos": plan.ignore_eos, "engine_overrides": plan.engine_overrides,
        "chat_template": True, "temperature": plan.temperature, "top_p": plan.top_p, "mode": plan.mode,
        "prefix_caching": False, "prompts": plan.prompts, "settle_after_switch_s": SETTLE_AFTER_SWITCH_S,
    }


def execute(plan: BenchPlan, *, rounds: int, batches: list[int], command: str, on_event: Event) -> dict[str, Any]:
    environment = {"versions": report.versions(), "machine": report.machine()}
    started = _dt.datetime.now().astimezone()
    runs = run_interleaved(plan, on_event) if plan.mode == "interleaved" else run_bench(plan, on_event)
    finished = _dt.datetime.now().astimezone()

    cells = stats.summarise(plan.policies, plan.cells, runs)
    found_checks = stats.checks(plan.policies, cells)
    specs = plan.specs()
    policies = [{"label": p.label, "kind": p.kind, "strict": not specs[p.label].relaxed.enabled,
                 "spec": specs[p.label].model_dump()} for p in plan.policies]
    seen: dict[str, Any] = {}
    for cell in plan.cells:
        w = cell.workload
        seen.setdefault(w.name, {"name": w.name, "description": w.description, "source": w.source,
                                 "distinct_prompts": w.size, "prompt_set_version": PROMPT_SET_VERSION, "phases": {}})
        seen[w.name]["phases"][str(cell.batch)] = [
            {"name": p.name, "kind": p.kind, "batch": len(p.prompts)} for p in cell.phases]

    out = plan.out_dir
    files: dict[str, Any] = {"results_json": str(out / "results.json"), "results_md": str(out / "results.md"),
                             "plots": [], "logs": str(out / "logs"), "traces": str(out / "traces"),
                             "outputs": str(out / "outputs")}
    title = f"{Path(plan.base_spec.target_model).name} ({plan.base_spec.method})\n" \
            f"{plan.max_tokens} tokens, {plan.repeats} repeats"
    if plots.available():
        files["plots"].append(str(plots.throughput(cells, out / "throughput.png", title)))
        series = [{**run.record(), "trace": run.trace} for run in runs if run.ok]
        k_plot = plots.k_over_time(series, out / "k_over_time.png", title)
        if k_plot:
            files["plots"].append(str(k_plot))
    else:
        files["plots_skipped"] = "matplotlib is not installed (pip install 'vspec[bench]')"

    document = report.build_document(
        started=started, finished=finished, command=command, settings=settings_of(plan, rounds, batches),
        environment=environment, policies=policies, workloads=list(seen.values()), cells=cells,
        checks=found_checks, runs=[r.record() for r in runs], files=files)
    document["pooled"] = stats.pooled(cells, runs)
    report.write_json(document, out / "results.json")
    write_text_atomic(out / "results.md", report.markdown(document))
    return document


def rerender(out_dir: Path) -> dict[str, Any]:
    """Redraw the plots and rewrite results.md from a finished bench's results.json and traces/."""
    import json

    from vspec_cli.benchlib.runner import EngineRun, file_label

    document = json.loads((out_dir / "results.json").read_text())
    settings = document["settings"]
    title = f"{Path(settings['target_model']).name} ({settings['method']})\n" \
            f"{settings['max_tokens']} tokens, {settings['repeats']} repeats"
    series = []
    for run in document["runs"]:
        trace_file = out_dir / "traces" / f"{file_label(run['policy'])}-r{run['repeat']}.jsonl"
        if run["ok"] and trace_file.exists():
            trace = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
            series.append({**run, "trace": trace})
    found = []
    if plots.available():
        found.append(str(plots.throughput(document["cells"], out_dir / "throughput.png", title)))
        k_plot = plots.k_over_time(series, out_dir / "k_over_time.png", title)
        if k_plot:
            found.append(str(k_plot))
    document["files"]["plots"] = found
    document["pooled"] = stats.pooled(document["cells"], [EngineRun.from_record(r) for r in document["runs"]])
    report.write_json(document, out_dir / "results.json")
    write_text_atomic(out_dir / "results.md", report.markdown(document))
    return document


def execute_serve(plan, *, workload: str, command: str, on_event: Event) -> dict[str, Any]:
    """The serve driver's session: servers under live load, then the same document family."""
    import json

    from vspec_cli.benchlib import serve_report
    from vspec_cli.benchlib.serve_driver import VSPEC_SERVER, run_serve_bench

    environment = {"versions": report.versions(), "machine": report.machine()}
    started = _dt.datetime.now().astimezone()
    runs, servers = run_serve_bench(plan, on_event)
    finished = _dt.datetime.now().astimezone()
    loads = [shape.label for shape in plan.loads]
    greedy = plan.sampling.temperature == 0
    cells = serve_report.summarise(plan.policies, loads, runs, greedy=greedy)
    found_checks = serve_report.checks(cells)
    spec = plan.base_spec
    settings = {
        "driver": "serve", "target_model": spec.target_model, "target_path": plan.target_path, "drafter": spec.drafter,
        "method": spec.method, "gamma": spec.gamma, "dtype": spec.serving.dtype, "max_num_seqs": spec.serving.max_num_seqs,
        "policies": [p.label for p in plan.policies], "workload": workload, "prompts": len(plan.prompts),
        "loads": [{"label": s.label, "kind": s.kind, "rate": s.rate, "duration_s": s.duration_s,
                   "burstiness": s.burstiness, "clients": s.clients} for s in plan.loads],
        "duration_s": plan.loads[0].duration_s, "burstiness": plan.loads[0].burstiness,
        "rounds": plan.rounds, "repeats": plan.repeats, "max_tokens": plan.sampling.max_tokens,
        "temperature": plan.sampling.temperature, "top_p": plan.sampling.top_p, "ignore_eos": plan.sampling.ignore_eos,
        "prefix_caching": True, "vllm_args": list(plan.vllm_args), "settle_after_switch_s": SETTLE_AFTER_SWITCH_S,
        "prompt_set_version": PROMPT_SET_VERSION,
    }
    out = plan.out_dir
    files: dict[str, Any] = {"results_json": str(out / "results.json"), "results_md": str(out / "results.md"),
                             "plots": [], "logs": str(out / "logs"), "traces": str(out / "traces"),
                             "requests": str(out / "requests")}
    title = f"{Path(spec.target_model).name} ({spec.method}), {plan.sampling.max_tokens} tokens, serve driver"
    if plots.available():
        rates = {s.label: s.rate for s in plan.loads if s.kind == "rate"}
        drawn = serve_report.plot_rates(cells, rates, out / "rates.png", title)
        ramp = next((s for s in plan.loads if s.kind == "ramp"), None)
        trace_file = out / "traces" / f"{VSPEC_SERVER}-r1.jsonl"
        if ramp is not None and trace_file.exists():
            trace = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
            drawn_ramp = serve_report.plot_ramp([r for r in runs if r.load == ramp.label], trace, ramp,
                                                out / "ramp_k.png", title)
            files["plots"] += [str(drawn_ramp)] if drawn_ramp else []
        files["plots"] += [str(drawn)] if drawn else []
    else:
        files["plots_skipped"] = "matplotlib is not installed (pip install 'vspec[bench]')"
    policies = [{"label": p.label, "kind": p.kind} for p in plan.policies]
    document = report.build_document(
        started=started, finished=finished, command=command, settings=settings, environment=environment,
        policies=policies, workloads=[{"name": workload, "distinct_prompts": len(plan.prompts),
                                       "prompt_set_version": PROMPT_SET_VERSION}],
        cells=cells, checks=found_checks, runs=[r.record() for r in runs], files=files)
    document["driver"] = "serve"
    document["servers"] = servers
    report.write_json(document, out / "results.json")
    write_text_atomic(out / "results.md", serve_report.markdown(document))
    return document
