"""A drafter built by vLLM's own model loader in a child process, without an engine (seconds, not an
engine start): what the tests of a head's checkpoint layout read back.

``probe(target, head, method, body)`` runs the prelude below, then ``body``, which sees ``model`` (the
loaded drafter, fp32), ``checkpoint`` (the head's model.safetensors), ``torch``, ``json`` and ``os``
and prints one line ``RESULT=<json>``; the parsed JSON comes back with the child's stderr (vLLM's
log). vspec's plugin is enabled in the child (VSPEC_SPEC), so architectures vspec registers (Qwen2
EAGLE) load too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRELUDE = r"""
import json, os, sys
target, head, method = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["VSPEC_SPEC"] = json.dumps({"method": method, "target_model": target, "drafter": head})
import torch
torch.accelerator.empty_cache = lambda: None  # as vLLM's CPU worker does: no accelerator here
from safetensors.torch import load_file
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model
config = EngineArgs(model=target, dtype="float32", max_model_len=256, enforce_eager=True,
                    speculative_config={"method": method, "model": head, "num_speculative_tokens": 2}
                    ).create_engine_config()
with set_current_vllm_config(config):
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="tcp://127.0.0.1:" + sys.argv[4])
    initialize_model_parallel(1, 1)
    model = get_model(vllm_config=config, model_config=config.speculative_config.draft_model_config)
checkpoint = load_file(os.path.join(head, "model.safetensors"))
"""


def probe(target: Path, head: Path, method: str, body: str) -> tuple[dict, str]:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k != "VSPEC_SPEC"}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + body, str(target), str(head), method, port], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT=")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[0].removeprefix("RESULT=")), proc.stderr
