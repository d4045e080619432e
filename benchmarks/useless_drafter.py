"""Build the "useless drafter" of docs/benchmarks.md: SmolLM2-135M's first 8 of 30 layers as a draft model.

It costs about a quarter of a target forward per drafted token and its drafts are rarely right, so
speculation with it never pays: the case where the controller must find K=0 and K=0 must be as fast
as target-only. Prints the folder (built once, reused after).

    .venv/bin/python benchmarks/useless_drafter.py [OUT_DIR]      # default bench-out/smollm2-8-layers
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(out: Path, layers: int = 8) -> Path:
    if (out / "config.json").exists():
        return out
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_truncated_copy

    from vspec_cli.demo_model import build_demo_model
    from vspec_runtime import paths

    return build_truncated_copy(out, build_demo_model(paths.model_dir() / "demo"), layers)


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "bench-out" / "smollm2-8-layers").resolve()))
