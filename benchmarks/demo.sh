#!/usr/bin/env bash
# The reference benchmark of docs/benchmarks.md: SmolLM2-135M-Instruct on CPU, n-gram drafting, every
# policy interleaved in warm engines (vspec bench's default mode), ratios with 95% intervals.
# Usage: benchmarks/demo.sh [OUT_DIR] [extra `vspec bench` flags...]
# About 24 minutes on a 2-core machine (6 rounds; 4 took 14); results in OUT_DIR (default bench-out/reference).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench-out/reference}"
shift || true
vspec_bin="${VSPEC:-.venv/bin/vspec}"
exec "$vspec_bin" bench --preset demo \
  --policies target-only,fixed:1,fixed:3,fixed:6,online \
  --workload copy,code,chat,mixed --batch 1,8 \
  --max-tokens 64 --rounds 6 --repeats 1 --prompts same \
  --out "$out" "$@"
