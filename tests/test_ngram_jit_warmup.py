"""The ngram-jit-warmup patch on vLLM's real n-gram drafter (no engine): what was broken, what is fixed.

vLLM 0.32's ``NgramProposer.__init__`` warms up with empty sampled-token lists, which ``propose``
skips, so its numba kernels compile inside the first serving step that drafts (about 1.5 s on the
demo). Each check runs in a fresh interpreter: numba's compiled signatures live for the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

# A stand-in for VllmConfig with only what NgramProposer.__init__ reads; the arrays of the second
# proposal are built the way vLLM's InputBatch builds token_ids_cpu and num_tokens_no_spec.
SCRIPT = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    import numpy as np
    import torch
    from vllm.v1.spec_decode import ngram_proposer
    from vspec_runtime.patches import ngram_jit_warmup

    if sys.argv[1] == "patched":
        ngram_jit_warmup.apply(ngram_proposer)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=1, prompt_lookup_max=4, num_speculative_tokens=3),
        model_config=SimpleNamespace(max_model_len=64), scheduler_config=SimpleNamespace(max_num_seqs=4),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))
    proposer = ngram_proposer.NgramProposer(config)
    after_init = len(ngram_proposer.batch_propose_numba.signatures)
    leftover = proposer.valid_ngram_num_drafts.tolist()

    token_ids_cpu = torch.zeros((4, 64), dtype=torch.int32).numpy()
    num_tokens_no_spec = torch.zeros((4,), dtype=torch.int32).numpy()
    token_ids_cpu[1, :7] = [5, 6, 7, 8, 5, 6, 7]
    num_tokens_no_spec[1] = 7
    drafts = proposer.propose(3, [[], [7], []], num_tokens_no_spec, token_ids_cpu)
    print(json.dumps({"after_init": after_init, "after_serving": len(ngram_proposer.batch_propose_numba.signatures),
                      "leftover": leftover, "drafts": drafts}))
""")


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_vllm_as_shipped_compiles_nothing_at_start_up():
    shipped = _run("shipped")
    assert shipped["after_init"] == 0, \
        "vLLM's own n-gram warm-up now compiles its kernels: the patch may be deleted (see its docstring)"
    assert shipped["after_serving"] == 1  # the first real proposal compiles, inside a serving step


def test_patched_start_up_compiles_the_signature_serving_uses():
    patched = _run("patched")
    assert patched["after_init"] == 1
    # Arrays built as vLLM's InputBatch builds them reuse that compilation: nothing compiles later.
    assert patched["after_serving"] == 1
    assert patched["drafts"] == [[], [8, 5, 6], []]  # "5 6 7" seen before, followed by 8 5 6
    assert patched["leftover"] == [0, 0, 0, 0]  # the warm-up leaves no draft count behind
