"""Patch: ``vllm.utils.cpu_triton_utils._expand_kernel_impl`` -- sampled requests under speculation on CPU.

Why: vLLM 0.32's CPU platform replaces the Triton kernel ``rejection_sampler.expand_kernel`` with
``cpu_triton_utils._expand_kernel_impl``, which hands ``_ensure_int64(output)`` to the C++ op
``_C.expand_kernel_impl``. For an int64 output that is the tensor itself; for any other dtype it is
a converted *copy*, so the op writes into the copy and the real output is never written (the other
CPU overrides copy their converted outputs back; this one does not). ``apply_sampling_constraints``
expands each request's temperature and top-p to its draft positions that way, into a tensor from
``new_empty``: whenever one request in a step samples, every draft position's logits are divided by
uninitialised memory, and the float temperatures are truncated to integers on the way in. Sampled
requests with drafts then emit junk (mean target log-probability about -4.7 nats per token against
-1.5 without speculation, on the demo), and greedy rows of the same step take their argmax from the
same garbage-scaled logits. Integer expansions (top-k) are right. Reproduction with vLLM alone
(`import torch` first; `vspec doctor` runs the same lines)::

    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs
    current_platform.register_triton_kernel_overrides()
    out = torch.full((9,), -123.0)
    rs._expand(out, torch.tensor([0.7, 0.5, 1.0]), torch.tensor([3, 6, 9], dtype=torch.int32), -1, 1)
    out  # still all -123.0

The other overrides in ``cpu_triton_utils`` were checked against their C++ schemas (the ``(a!)``
arguments the ops write): every output they convert to int64 is copied back (greedy and random
rejection sampling, recovered tokens, the EAGLE input kernels) or passed through unconverted (slot
mappings, masks, indices); only the expand kernel drops its output.

How: ``_expand_kernel_impl`` is replaced by a wrapper that keeps vLLM's C++ op for int64 outputs
(where it is right) and expands every other dtype with ``torch.repeat_interleave`` into the real
output, with the kernel's replace rule (``replace_from`` -> ``replace_to``). The platform registers
its overrides *by reference* (``platforms/cpu.py`` passes ``cpu_tl._expand_kernel_impl`` to
``vllm.triton_utils.dispatcher.register_kernels``, which wraps it and rebinds every holder of the
kernel), so replacing the module attribute reaches the engine only if it happens before that
registration. The plugin loads before the worker registers its overrides (``init_worker`` calls
``load_general_plugins`` first), which is the usual case; if the overrides are already registered,
the fixed function is registered again through the same public ``register_kernels``. The first
float expansion logs one line, so a server log shows the fix is live.

Enabled by: any speculative method (``spec.speculating``), in every process that imports
``vllm.utils.cpu_triton_utils`` (CPU workers only; CUDA runs the Triton kernel and never imports it).

Delete when: vLLM's CPU ``_expand_kernel_impl`` writes non-int64 outputs (copies the converted
output back, or expands floats itself). `vspec doctor` runs vLLM's own function on a float input and
says whether the bug is still there.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any, Callable, Optional

from vspec_runtime.patches import _base, _hooks

logger = logging.getLogger("vspec.patches")

NAME = "cpu-expand-kernel"
TARGET_MODULE = "vllm.utils.cpu_triton_utils"
KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"  # the name the CPU platform registers
SYMBOLS = (
    f"{TARGET_MODULE}:_expand_kernel_impl",
    "vllm.triton_utils.dispatcher:register_kernels",
    "vllm.v1.sample.rejection_sampler:expand_batch_to_tokens",
)


def install(spec) -> None:
    """Arrange for the patch to be applied when (or if already) the CPU kernel module is imported."""
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType) -> bool:
    """Patch ``module._expand_kernel_impl`` and re-point a registered override; False if already done."""
    _base.check_symbols(NAME, SYMBOLS)
    original = _base.original_of(module, "_expand_kernel_impl")
    patched = _base.patch_attribute(module, "_expand_kernel_impl", NAME, _make_wrapper)
    _reregister_if_needed(original, module._expand_kernel_impl)
    return patched


def expand_into(output, input_val, cu_num_tokens, replace_from: Any, replace_to: Any) -> None:
    """What the Triton ``expand_kernel`` does: request i's value fills its span of ``output``."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    replacement = torch.full_like(input_val, replace_to)
    values = torch.where(input_val == replace_from, replacement, input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded)


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        if output.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        expand_into(output, input_val, cu_num_tokens, replace_from, replace_to)
        _log_first_fix(output.dtype)
        return None

    return _expand_kernel_impl


def _log_first_fix(dtype: Any) -> None:
    if _base.first_time(NAME):
        # The first one is usually vLLM's own sampler warm-up at start-up, then every sampled step with drafts.
        logger.info("vspec patch %s live: expanded a %s tensor (per-draft-position temperature or top-p) that "
                    "vLLM's CPU kernel would have left unwritten", NAME, str(dtype).replace("torch.", ""))


def _reregister_if_needed(original: Callable[..., Any], fixed: Callable[..., Any]) -> None:
    """If the platform already registered vLLM's function, register the fixed one in its place."""
    sampler = sys.modules.get("vllm.v1.sample.rejection_sampler")
    registered: Optional[Any] = getattr(sampler, "expand_kernel", None) if sampler else None
    if registered is None or getattr(registered, "func", None) is not original:
        return  # not registered yet: the platform will pick up the fixed module attribute
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({KERNEL_NAME: fixed})
    logger.info("vspec patch %s: re-registered the CPU expand kernel (overrides were registered first)", NAME)


def upstream_drops_float_output() -> bool:
    """Run vLLM's own CPU expand function on a float input: True when it leaves the output unwritten.

    For `vspec doctor` and the tests; needs vLLM's CPU ops (``vllm._C``) to be loadable.
    """
    import torch

    module = sys.modules.get(TARGET_MODULE) or __import__(TARGET_MODULE, fromlist=["_expand_kernel_impl"])
    upstream = _base.original_of(module, "_expand_kernel_impl")
    output = torch.full((4,), -123.0)
    upstream(output, torch.tensor([0.5, 2.0]), torch.tensor([2, 4], dtype=torch.int32), -1, 1)
    return bool((output == -123.0).all())
