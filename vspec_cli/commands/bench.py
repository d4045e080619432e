"""`vspec bench`: policies side by side on the same prompts in one run (command line and rendering only).

The work happens in vspec_cli/benchlib/; this module parses the options, shows progress on stderr
and renders the results document (a table for people, JSON with --json).
"""

from __future__ import annotations

import datetime as _dt
import inspect
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli._options import ConfigOpt, JsonOpt, parse_number_list
from vspec_cli.spec_flags import ADAPTIVE_TUNING_FIELDS, ENGINE_FIELDS, MODEL_FIELDS, SpecOverrides, spec_flags
from vspec_cli.workloads import help_text as workload_help

BENCH_PANEL = "Benchmark"
SERVE_PANEL = "Serve driver (--driver serve)"
ADVANCED_PANEL = "Advanced"
DEFAULT_POLICIES = "target-only,fixed:1,fixed:3,fixed:6,online"

EXAMPLES = """
[bold]Workloads[/bold]

{workloads}

[bold]Policies[/bold]: target-only, fixed:K (constant K through vspec's scheduler), fixed:1-6 (a sweep),
vllm-fixed:K (plain vLLM's own fixed-K path, a baseline), table:1=6,8=1 (a batch-size table), online,
profile:PATH. Adaptive policies use the preset's gamma as max K.

[bold]Modes[/bold]: interleaved (default): per repeat, warm engines run every policy round by round in a
balanced order on the same prompts; ratios come from paired rounds with 95% intervals, and a target
is "met", "missed" or "not resolved". engines: one fresh engine per policy and repeat (the old method;
fixed:K then runs vLLM's own path).

[bold]Examples[/bold]

  vspec bench --preset demo                              # the default policies on copy, code and chat, batch 1 and 8
  vspec bench --preset demo --policies target-only,fixed:1-6,online --workload mixed --batch 1,8
  vspec bench --preset demo --workload prompts.jsonl --batch 4 --repeats 3 --out bench-out/mine
  vspec bench --preset demo --policies target-only,online --json > results.json
  vspec bench --preset demo --temperature 0.8 --top-p 0.95     # sampled: quality column, no equality check
""".format(workloads=workload_help())



@spec_flags(MODEL_FIELDS + ADAPTIVE_TUNING_FIELDS + ENGINE_FIELDS)
def bench(
    preset: Annotated[Optional[str], typer.Option("--preset", "-p", help="Preset name or .toml file (as for `vspec serve`).",
                                                  rich_help_panel=BENCH_PANEL, show_default=False)] = None,
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policies (see below). Default: "
                                          + DEFAULT_POLICIES.replace(",", ", ") + ".",
                                          rich_help_panel=BENCH_PANEL, show_default=False)] = DEFAULT_POLICIES,
    workload: Annotated[str, typer.Option("--workload", "-w", help="Comma-separated workloads: copy, code, chat, mixed, hetero or FILE.jsonl.",
                                          rich_help_panel=BENCH_PANEL)] = "copy,code,chat",
    batch: Annotated[str, typer.Option("--batch", "-b", help="Comma-separated batch sizes (prompts submitted at once).",
                                       rich_help_panel=BENCH_PANEL)] = "1,8",
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="New tokens per prompt (greedy).",
                                            rich_help_panel=BENCH_PANEL)] = 128,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1, help="Engine runs per policy; the policy order rotates.",
                                         rich_help_panel=BENCH_PANEL)] = 2,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Batches per cell in each run (mixed: 4 phases per round).",
                                        rich_help_panel=BENCH_PANEL)] = 2,
    prompts: Annotated[str, typer.Option("--prompts", help="same: every round repeats the cell's prompts (intervals "
                                         "cover timing noise on that prompt set); new: each round takes new prompts "
                                         "(intervals also cover prompt-to-prompt variation, much wider).",
                                         rich_help_panel=BENCH_PANEL)] = "same",
    mode: Annotated[str, typer.Option("--mode", help="interleaved (policies share warm engines, paired rounds) or "
                                      "engines (one engine per policy and repeat).", rich_help_panel=BENCH_PANEL)] = "interleaved",
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy (outputs compared with "
                                               "target-only); > 0 samples with fixed seeds and reports quality.",
                                               rich_help_panel=BENCH_PANEL)] = 0.0,
    top_p: Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling with --temperature.",
                                                   rich_help_panel=BENCH_PANEL, show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output folder (default: bench-out/<date-time>).",
                                                rich_help_panel=BENCH_PANEL, show_default=False)] = None,
    json_out: JsonOpt = False,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Always generate --max-tokens tokens.",
                                             rich_help_panel=ADVANCED_PANEL)] = False,
    driver: Annotated[str, typer.Option("--driver", help="offline: batches submitted at once to in-process engines; "
                                        "serve: live load (request rates, a ramp, closed-loop clients) through real "
                                        "servers.",
                                        rich_help_panel=BENCH_PANEL)] = "offline",
    rates: Annotated[Optional[str], typer.Option("--rates", help="serve driver: comma-separated request rates "
                                                 "(req/s); default 0.25,0.5,1,2,4, none when --concurrency is given.",
                                                 rich_help_panel=SERVE_PANEL, show_default=False)] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="serve driver: closed-loop loads, "
                                                       "comma-separated client counts; each client sends its next "
                                                       "request when its answer is complete (as vllm bench serve "
                                                       "--max-concurrency).", rich_help_panel=SERVE_PANEL,
                                                       show_default=False)] = None,
    duration: Annotated[float, typer.Option("--duration", min=1.0, help="serve driver: seconds of arrivals per load "
                                            "(closed loops: seconds of sending).", rich_help_panel=SERVE_PANEL)] = 20.0,
    ramp: Annotated[Optional[float], typer.Option("--ramp", min=0.0, help="serve driver: add a ramp load rising to this "
                                                  "rate (req/s) at half time and falling back; 0 for none.",
                                                  rich_help_panel=SERVE_PANEL, show_default=False)] = None,
    ramp_duration: Annotated[float, typer.Option("--ramp-duration", min=2.0, help="serve driver: seconds of the ramp.",
                                                 rich_help_panel=SERVE_PANEL)] = 60.0,
    burstiness: Annotated[float, typer.Option("--burstiness", min=0.01, help="serve driver: arrival gamma shape "
                                              "(1 = Poisson; lower = burstier).", rich_help_panel=SERVE_PANEL)] = 1.0,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="Skip vLLM's compilation: engines start in seconds "
                                                "(for quick checks; not how `vspec serve` runs).",
                                                rich_help_panel=ADVANCED_PANEL)] = False,
    step_samples: Annotated[bool, typer.Option("--step-samples", help="The controllers also write "
                                               "every verified step (policy, K, step time, tokens verified) to "
                                               "traces/*.samples.jsonl, to study what they measured; a line a step, "
                                               "so off by default.", rich_help_panel=ADVANCED_PANEL)] = False,
    config: ConfigOpt = None,
    *,
    spec_overrides: SpecOverrides,
) -> None:
    """Run policies side by side on the same prompts: tok/s, ratios with intervals, acceptance, K chosen, equality.

    Every cell (workload x batch) is a few rounds, each a batch submitted at once (offline `LLM`, in
    subprocesses). Writes results.json, results.md and PNG plots to --out; progress goes to stderr, the
    table (or --json) to stdout. Exit 1 when an engine failed or a strict policy's greedy tokens differ
    from target-only's.
    """
    from vspec_cli.benchlib import report, session
    from vspec_cli.benchlib.policies import parse_policies, policy_spec
    from vspec_cli.benchlib.runner import BenchPlan, build_cells
    from vspec_cli.resolve import resolve_model_paths, resolve_spec
    from vspec_cli.demo_model import prepare_demo_with_progress
    from vspec_cli.workloads import parse_workloads

    if driver not in ("offline", "serve"):
        raise UserInputError(f"--driver must be offline or serve, not '{driver}'")
    if mode not in ("interleaved", "engines"):
        raise UserInputError(f"--mode must be interleaved or engines, not '{mode}'")
    if prompts not in ("same", "new"):
        raise UserInputError(f"--prompts must be same or new, not '{prompts}'")
    if top_p is not None and temperature == 0:
        raise UserInputError("--top-p needs --temperature > 0 (greedy decoding ignores it)")
    bench_policies = parse_policies(policies)
    workloads = parse_workloads(workload)
    batches = parse_number_list(batch, "--batch", int, "batch sizes")
    if driver == "serve":
        from vspec_cli.benchlib.serve_cli import validate_serve_options

        validate_serve_options(bench_policies, workloads, rates, concurrency)
    spec = resolve_spec(preset, str(config) if config else None, spec_overrides)
    for policy in bench_policies:
        policy_spec(spec, policy)  # every policy's spec validates before any engine starts
    model_paths = resolve_model_paths(spec, strict=True, prepare_demo=prepare_demo_with_progress)
    out_dir = out or Path("bench-out") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if driver == "serve":
        from vspec_cli.benchlib.serve_cli import run_serve_driver

        run_serve_driver(
            spec=spec, model_paths=model_paths, policies=bench_policies, workloads=workloads, rates=rates,
            concurrency=concurrency, duration=duration, ramp=ramp, ramp_duration=ramp_duration, burstiness=burstiness,
            rounds=rounds,
            repeats=repeats, max_tokens=max_tokens, temperature=temperature, top_p=top_p, ignore_eos=ignore_eos,
            enforce_eager=enforce_eager, step_samples=step_samples, out_dir=out_dir, json_out=json_out,
            progress=_Progress)
        return
    plan = BenchPlan(
        base_spec=spec, target_path=model_paths.target, drafter_path=model_paths.drafter, policies=bench_policies,
        cells=build_cells(workloads, batches, rounds, same_prompts=prompts == "same"), repeats=repeats, max_tokens=max_tokens,
        ignore_eos=ignore_eos, out_dir=out_dir, engine_overrides={"enforce_eager": True} if enforce_eager else {},
        mode=mode, temperature=temperature, top_p=top_p, prompts=prompts, step_samples=step_samples,
    )
    for note in model_paths.notes:
        _output.warn(note)
    top = spec.serving.max_num_seqs
    if top is not None and max(batches) > top:
        _output.warn(f"batch {max(batches)} exceeds max_num_seqs {top}: vLLM queues the rest, so fewer run at once")

    if mode == "interleaved":
        _output.hint(f"vspec bench: {len(bench_policies)} policies interleaved in warm engines, {repeats} repeats, "
                     f"{len(plan.cells)} cells x {rounds} rounds; output in {out_dir}")
    else:
        _output.hint(f"vspec bench: {len(bench_policies)} policies x {repeats} repeats = "
                     f"{len(bench_policies) * repeats} engine runs, {len(plan.cells)} cells; output in {out_dir}")
    with _Progress() as progress:
        document = session.execute(plan, rounds=rounds, batches=batches, command=report.command_line(),
                                   on_event=progress.event)
    if json_out:
        _output.print_json("bench", {k: v for k, v in document.items() if k != "schema"})
    else:
        _render(document)
    failed = [r for r in document["runs"] if not r["ok"]]
    if failed:
        _output.warn(f"{len(failed)} engine run(s) failed; their cells lack those numbers (logs in {out_dir / 'logs'})")
        raise typer.Exit(1)
    differing = strict_mismatches(document)
    if differing:
        _output.warn("strict policies whose greedy tokens differ from target-only's (speculation must be lossless): "
                     + ", ".join(differing) + f"; outputs in {out_dir / 'outputs'}")
        raise typer.Exit(1)


def strict_mismatches(document: dict[str, Any]) -> list[str]:
    """'policy in cell' for each strict policy whose greedy outputs differ from target-only's."""
    strict = {p["label"] for p in document["policies"] if p["strict"]}
    return [f"{label} in {cell['cell']}" for cell in document["cells"] for label, row in cell["policies"].items()
            if label in strict and row.get("matches_target_only") is False]


class _Progress:
    """The stderr progress display: engine runs overall, phases of the current engine."""

    def __enter__(self) -> "_Progress":
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=_output.stderr)
        self.progress.__enter__()
        self.engines = self.progress.add_task("engine runs", total=None)
        self.phases = self.progress.add_task("phases", total=None, visible=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def event(self, kind: str, **fields: Any) -> None:
        if kind == "engine":
            self.progress.update(self.engines, total=fields["total"],
                                 description=f"repeat {fields['repeat'] + 1}: {fields['policy']}")
            self.progress.reset(self.phases, total=None, visible=True, description="  starting engine")
        elif kind == "stage" and fields.get("stage") == "phase":
            self.progress.update(self.phases, total=fields["phases"], completed=fields["phase"],
                                 description=f"  {fields['name']}")
            if not self.progress.console.is_terminal:  # a log file: one plain line per phase instead of a bar
                self.progress.console.print(f"phase {fields['phase'] + 1}/{fields['phases']}: {fields['name']}",
                                            highlight=False)
        elif kind == "stage" and fields.get("stage") == "done":
            self.progress.update(self.phases, completed=fields["phases"], description="  done")
        elif kind == "engine-done":
            self.progress.advance(self.engines)
            if not fields["ok"]:
                first_line = (fields.get("error") or "").splitlines()[0]
                self.progress.console.print(f"[yellow]Warning:[/yellow] {fields['policy']} repeat "
                                            f"{fields['repeat'] + 1} failed: {first_line}", highlight=False)


def _render(document: dict[str, Any]) -> None:
    from rich.table import Table

    from vspec_cli.benchlib.report import (checks_lines, headroom_lines, pairs_line, pooled_lines, table_columns,
                                           table_rows)

    table = Table(*table_columns(document["cells"]), title="vspec bench", title_justify="left")
    previous = None
    for row in table_rows(document["cells"]):
        if previous is not None and row[0] != previous:
            table.add_section()
        table.add_row(*row)
        previous = row[0]
    _output.stdout.print(table)
    needs = pairs_line(document["cells"])
    if needs:
        _output.stdout.print(needs, highlight=False)
    for line in pooled_lines(document):
        _output.stdout.print(f"pooled over cells, {line}", highlight=False)
    for line in headroom_lines(document["cells"]):
        _output.stdout.print(line, highlight=False)
    for line in checks_lines(document["checks"]):
        _output.stdout.print(line, highlight=False)
    files = document["files"]
    _output.hint(f"results: {files['results_json']}, {files['results_md']}"
                 + (", " + ", ".join(files["plots"]) if files["plots"] else ""))
    if files.get("plots_skipped"):
        _output.warn(f"plots skipped: {files['plots_skipped']}")


def register(app: typer.Typer) -> None:
    app.command("bench", help=inspect.cleandoc(bench.__doc__) + "\n" + EXAMPLES)(bench)
