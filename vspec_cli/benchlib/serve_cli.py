"""`vspec bench --driver serve`: option checks, the plan, progress and the rendered table.

Kept apart from vspec_cli/commands/bench.py so that the offline command reads as before; the work
happens in serve_driver.py (servers, loads) and serve_report.py (statistics, checks, plots).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli._options import parse_number_list
from vspec_cli.benchlib.load import LoadShape, Sampling
from vspec_cli.benchlib.policies import BenchPolicy

DEFAULT_RATES = "0.25,0.5,1,2,4"


def parse_rates(text: str, required: bool = True) -> list[float]:
    if not required and not text.strip():
        return []
    return parse_number_list(text, "--rates", float, "requests per second")


def parse_clients(text: Optional[str]) -> list[int]:
    """--concurrency: comma-separated client counts of the closed-loop loads (none when not given)."""
    return [] if text is None else parse_number_list(text, "--concurrency", int, "clients")


def load_shapes(rates: Optional[str], concurrency: Optional[str], duration: float, ramp: Optional[float],
                ramp_duration: float, burstiness: float) -> list[LoadShape]:
    """The loads of a serve bench in the order they run: rates, closed loops, then the ramp. Without
    --rates, the default rates run unless --concurrency asked for closed loops only."""
    clients = parse_clients(concurrency)
    if rates is None:
        rates = "" if clients else DEFAULT_RATES
    loads = [LoadShape("rate", rate, duration, burstiness) for rate in parse_rates(rates, required=not clients)]
    loads += [LoadShape("clients", 0.0, duration, clients=count) for count in clients]
    if ramp:
        loads.append(LoadShape("ramp", ramp, ramp_duration, burstiness))
    return loads


def check_policies(policies: list[BenchPolicy]) -> None:
    offline_only = [p.label for p in policies if p.kind == "vllm-fixed"]
    if offline_only:
        raise UserInputError(f"the serve driver runs policies in one vspec server; {', '.join(offline_only)} "
                             "(vLLM's own fixed-K path) needs a server of its own: use the offline driver for it")


def prompt_pool(workloads: list[Any]) -> tuple[str, list[str]]:
    """The prompts requests draw from (at random, per request): every named workload's, pooled, so the
    default copy,code,chat gives mixed traffic."""
    pool: list[str] = []
    for workload in workloads:
        phases = workload.phase_plan(1, workload.size)
        pool += [prompt for phase in phases for prompt in phase.prompts]
    return "+".join(w.name for w in workloads), list(dict.fromkeys(pool))


def validate_serve_options(policies: list[BenchPolicy], workloads: list[Any], rates: Optional[str],
                           concurrency: Optional[str]) -> None:
    """Everything the serve driver refuses, checked before any model is resolved or server started."""
    check_policies(policies)
    prompt_pool(workloads)
    load_shapes(rates, concurrency, 1.0, None, 2.0, 1.0)


def run_serve_driver(*, spec, model_paths, policies: list[BenchPolicy], workloads: list[Any], rates: Optional[str],
                     concurrency: Optional[str], duration: float, ramp: Optional[float], ramp_duration: float,
                     burstiness: float, rounds: int,
                     repeats: int, max_tokens: int, temperature: float, top_p: Optional[float], ignore_eos: bool,
                     enforce_eager: bool, step_samples: bool, out_dir: Path, json_out: bool, progress) -> None:
    from vspec_cli.benchlib import report, session
    from vspec_cli.benchlib.serve_driver import ServePlan

    check_policies(policies)
    workload, prompts = prompt_pool(workloads)
    loads = load_shapes(rates, concurrency, duration, ramp, ramp_duration, burstiness)
    plan = ServePlan(
        base_spec=spec, target_path=model_paths.target, drafter_path=model_paths.drafter, policies=policies,
        prompts=prompts, loads=loads, rounds=rounds, repeats=repeats,
        sampling=Sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p, ignore_eos=ignore_eos,
                          seed=0 if temperature > 0 else None),
        out_dir=out_dir, vllm_args=("--enforce-eager",) if enforce_eager else (), step_samples=step_samples,
    )
    for note in model_paths.notes:
        _output.warn(note)
    _output.hint(f"vspec bench (serve driver): {len(policies)} policies, {len(loads)} loads x {rounds} rounds, "
                 f"{repeats} repeats; output in {out_dir}")
    with progress() as shown:
        document = session.execute_serve(plan, workload=workload, command=report.command_line(), on_event=shown.event)
    if json_out:
        _output.print_json("bench", {k: v for k, v in document.items() if k != "schema"})
    else:
        render(document)
    failed = [s for s in document["servers"] if not s["ok"]]
    if failed:
        _output.warn(f"{len(failed)} server run(s) failed; logs in {out_dir / 'logs'}")
        raise typer.Exit(1)


def render(document: dict[str, Any]) -> None:
    from rich.table import Table

    from vspec_cli.benchlib.serve_report import TERMINAL_COLUMNS, checks_lines, terminal_rows

    table = Table(*TERMINAL_COLUMNS, title="vspec bench (serve driver)", title_justify="left")
    previous = None
    for row in terminal_rows(document["cells"]):
        if previous is not None and row[0] != previous:
            table.add_section()
        table.add_row(*row)
        previous = row[0]
    _output.stdout.print(table)
    for line in checks_lines(document["checks"]):
        _output.stdout.print(line, highlight=False)
    files = document["files"]
    _output.hint(f"results: {files['results_json']}, {files['results_md']}"
                 + (", " + ", ".join(files["plots"]) if files["plots"] else ""))
