#!/usr/bin/env bash
# The demo benchmark of docs/benchmarks.md: SmolLM2-135M-Instruct on CPU, n-gram drafting.
# Usage: benchmarks/demo.sh [OUT_DIR] [extra `vspec bench` flags...]
# Takes about half an hour on a 2-core machine; results in OUT_DIR (default bench-out/demo-r3).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out/demo-r3}"
shift || true
vspec_bin="${VSPEC:-.venv/bin/vspec}"
exec "$vspec_bin" bench --preset demo \
  --policies target-only,fixed:1,fixed:3,fixed:6,online \
  --workload copy,chat,mixed --batch 1,8 \
  --max-tokens 128 --rounds 1 --repeats 3 \
  --out "$out" "$@"
