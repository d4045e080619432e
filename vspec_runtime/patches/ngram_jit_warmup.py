"""Patch: ``vllm.v1.spec_decode.ngram_proposer.NgramProposer.__init__`` -- compile the n-gram kernels at start-up.

Why: the n-gram drafter searches each context with two numba functions (``batch_propose_numba`` and
the ``_find_longest_matched_ngram_and_propose_tokens`` it calls), compiled on their first call.
``NgramProposer.__init__`` means to pay that at start-up ("Trigger Numba JIT compilation"), but it
passes ``[[]] * 1024`` as the sampled tokens: ``propose`` skips every request without sampled
tokens, and ``batch_propose`` skips the numba call when none is left, so nothing is compiled
(upstream: vllm PR 38326, open). The compilation then lands inside the first serving step that
drafts: on the demo, that step took about 1.2-1.7 s more than the same step later (the first
``fixed:6`` round 3.9 s against 2.2 s; in `vspec bench` the first speculative round of a repeat ran
0.75x the others). A server's first request with drafts pays it; the bench's first K>0 round paid it.

How: after vLLM's ``__init__``, one proposal on a one-row context that repeats (1, 2, 1, 2), with
arrays of the dtypes and layouts the model runner passes (C-contiguous int32, as
``InputBatch.token_ids_cpu`` and ``num_tokens_no_spec``; numba specialises on type, dimensions
and layout, not on length), so both functions compile for the signature serving uses. The
proposer's output buffers are left as vLLM's own warm-up leaves them (no drafts recorded).
About a second of start-up instead of a second in the first request.

Enabled by: the n-gram method (``spec.method == "ngram"``), in the process that builds the drafter.

Delete when: vLLM's own warm-up reaches the kernels (the upstream PR lands):
tests/test_ngram_jit_warmup.py then fails its "vLLM as shipped compiles nothing" check, and
``benchmarks/first_draft_step.py`` shows the first drafting round as fast without the patch.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any, Callable

from vspec_runtime.patches import _base, _hooks

logger = logging.getLogger("vspec.patches")

NAME = "ngram-jit-warmup"
TARGET_MODULE = "vllm.v1.spec_decode.ngram_proposer"
_PROPOSER = f"{TARGET_MODULE}:NgramProposer"
SYMBOLS = (
    _PROPOSER,  # its __init__, with vllm_config first
    f"{_PROPOSER}.propose",
    f"{_PROPOSER}.valid_ngram_num_drafts",
    f"{TARGET_MODULE}:batch_propose_numba",
)


def install(spec) -> None:
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType) -> bool:
    _base.check_symbols(NAME, SYMBOLS)
    return _base.patch_attribute(module.NgramProposer, "__init__", NAME, _make_init)


def _make_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        compile_kernels(self)

    return __init__


def compile_kernels(proposer: Any) -> float:
    """One real proposal, so numba compiles what serving calls; returns the seconds it took."""
    import numpy as np

    started = time.perf_counter()
    context = np.zeros((1, 8), dtype=np.int32)
    context[0, :4] = (1, 2, 1, 2)  # "1 2" repeats: the search finds a match and proposes
    proposer.propose(1, [[2]], np.array([4], dtype=np.int32), context)
    proposer.valid_ngram_num_drafts[0] = 0
    seconds = time.perf_counter() - started
    logger.info("vspec patch %s: n-gram kernels compiled at start-up (%.2f s)", NAME, seconds)
    return seconds
