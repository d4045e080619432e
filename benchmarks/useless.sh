#!/usr/bin/env bash
# The "speculation never pays" reference of docs/benchmarks.md: SmolLM2-135M-Instruct on CPU drafted by
# its own first 8 layers (benchmarks/useless_drafter.py builds it), so every drafted token costs about a
# quarter of a target step and is rarely right. The controller must find K=0 and K=0 must cost what
# target-only costs. Policies interleaved in warm engines (vspec bench's default mode).
# Usage: benchmarks/useless.sh [OUT_DIR] [extra `vspec bench` flags...]
# About 8 minutes on a 2-core machine; results in OUT_DIR (default bench-out/useless).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out/useless}"
shift || true
python_bin="${PYTHON:-.venv/bin/python}"
vspec_bin="${VSPEC:-.venv/bin/vspec}"
drafter="$("$python_bin" benchmarks/useless_drafter.py)"
exec "$vspec_bin" bench --preset demo --method draft --drafter "$drafter" \
  --policies target-only,table:1=0,online \
  --workload chat --batch 1,8 \
  --max-tokens 64 --rounds 4 --repeats 1 \
  --out "$out" "$@"
