"""Redraw a finished bench's plots and results.md (after changing plots.py or report.py).

Usage: .venv/bin/python benchmarks/replot.py bench-out/demo
"""

import sys
from pathlib import Path

from vspec_cli.benchlib.session import rerender

if __name__ == "__main__":
    for folder in sys.argv[1:] or ["bench-out/demo"]:
        document = rerender(Path(folder))
        print("\n".join(document["files"]["plots"] + [str(Path(folder) / "results.md")]))
