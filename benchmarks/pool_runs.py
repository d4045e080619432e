"""Pool several finished bench runs: each policy's ratios over every cell of every run at once.

Usage: .venv/bin/python benchmarks/pool_runs.py bench-out/reference-28 bench-out/reference-29
       .venv/bin/python benchmarks/pool_runs.py bench-out/serve-mixed8-pr bench-out/serve-mixed8-pr2

`vspec bench` prints the same lines for one run ("pooled over cells"); this adds runs of the same
command together, each run's cells as strata of their own (vspec_cli/benchlib/paired.py,
`stratified_interval`), to resolve what one run cannot. Serve-driver runs (`--driver serve`) are
pooled per load instead, every run's rounds as one sample (vspec_cli/benchlib/serve_report.py,
`pooled_over_runs`): against target-only, each run's best baseline, online, and in TPOT p50.
"""

import json
import sys
from pathlib import Path

from vspec_cli.benchlib import serve_report, stats
from vspec_cli.benchlib.report import pooled_lines
from vspec_cli.benchlib.runner import EngineRun


def pooled_over_runs(folders: list[Path]) -> list[dict]:
    strata: dict[tuple[str, str], list[list[float]]] = {}
    for folder in folders:
        document = json.loads((folder / "results.json").read_text())
        runs = [EngineRun.from_record(record) for record in document["runs"]]
        for key, found in stats.pooled_logs(document["cells"], runs).items():
            strata.setdefault(key, []).extend(found)
    return stats.pooled_intervals(strata)


if __name__ == "__main__":
    folders = [Path(arg) for arg in sys.argv[1:]]
    if not folders:
        sys.exit(__doc__)
    missing = [str(f) for f in folders if not (f / "results.json").is_file()]
    if missing:
        sys.exit(f"no results.json in: {', '.join(missing)}")
    try:
        documents = [json.loads((folder / "results.json").read_text()) for folder in folders]
        drivers = {document.get("driver", "offline") for document in documents}
        if len(drivers) > 1:
            sys.exit("these runs mix the serve driver with the offline one: pool runs of one command")
        if drivers == {"serve"}:
            lines = serve_report.pooled_lines(serve_report.pooled_over_runs(documents))
        else:
            lines = pooled_lines({"pooled": pooled_over_runs(folders)})
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # not a results.json vspec bench wrote
        sys.exit(f"cannot pool these runs: a results.json is not one vspec bench wrote ({type(error).__name__}: {error})")
    print("\n".join(lines))
