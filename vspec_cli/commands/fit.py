"""`vspec fit SAMPLES -o PROFILE`: fit the step-latency model to a samples file.

The file side is profiling/fit_file.py, the maths profiling/fit.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from vspec_cli import _output
from vspec_cli._errors import UserInputError
from vspec_cli._options import JsonOpt

EXAMPLES = """
[bold]Examples[/bold]

  vspec fit profiles/demo-cpu.samples.jsonl -o profiles/demo-cpu.json
  vspec fit run.samples.jsonl -o gamma4.json --max-gamma 4    # for a server started with --gamma 4
  vspec fit run.samples.jsonl -o p.json --method draft --json
"""


def fit(
    samples: Annotated[Path, typer.Argument(help="Samples file (JSON lines) from `vspec profile collect`.",
                                            show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write.", show_default=False)],
    method: Annotated[Optional[str], typer.Option(
        help="Drafting method of the samples (default: from the manifest beside them, else ngram).",
        show_default=False)] = None,
    max_gamma: Annotated[Optional[int], typer.Option(
        help="Fit only K <= this (the maximum K of the server that will use the profile).", show_default=False)] = None,
    holdout_every: Annotated[int, typer.Option(help="Hold out every N-th stable sample to measure the error (0: none).")] = 5,
    table: Annotated[bool, typer.Option("--table/--no-table",
                                        help="Add the measured batch-size -> K prior to the profile.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Fit the step-latency model by non-negative least squares and report the held-out error.

    Model: T_step = target(ctx, n) + K x drafter(ctx, B) + overhead(K), each forward
    alpha x ctx + c x tokens + delta, fitted jointly on all stable steps (scipy.optimize.nnls).
    """
    from vspec_cli.profiling.fit_file import fit_file
    from vspec_cli.profiling.render import render_fit

    if holdout_every < 0:
        raise UserInputError(f"--holdout-every: got {holdout_every}; must be >= 0")
    result, document = fit_file(samples, output, method=method, max_gamma=max_gamma,
                                holdout_every=holdout_every, with_table=table)
    if json_out:
        _output.print_json("fit", {"profile_path": str(output), "profile": document, "fit": result.summary()})
        return
    render_fit(result, output)


def register(app: typer.Typer) -> None:
    app.command("fit", help=inspect.cleandoc(fit.__doc__) + "\n" + EXAMPLES)(fit)
