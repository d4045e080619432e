"""The cpu-expand-kernel patch on vLLM's real CPU kernels (no engine): what was broken, what is fixed.

vLLM 0.32's CPU ``_expand_kernel_impl`` hands an int64 copy of a float output to its C++ op, so the
per-draft-position temperatures and top-p values of sampled requests are never written. The engine
level consequences are tested in tests/test_sampling_lossless.py.
"""

from __future__ import annotations

import pytest

from conftest import register_cpu_kernel_overrides

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def sampler():
    import torch  # noqa: F401 - vLLM's CPU ops need torch first
    from vllm.v1.sample import rejection_sampler

    from vspec_runtime.patches import cpu_expand_kernel

    register_cpu_kernel_overrides()  # as a worker does, before or after the patch
    cpu_expand_kernel.install(None)
    return rejection_sampler


def test_vllm_as_shipped_leaves_float_outputs_unwritten(sampler):
    from vspec_runtime.patches import cpu_expand_kernel

    assert cpu_expand_kernel.upstream_drops_float_output(), \
        "vLLM's CPU expand kernel now writes floats: the patch may be deleted (see its docstring)"


@pytest.mark.parametrize("dtype_name", ["float32", "int32", "int64"])
def test_expand_batch_to_tokens_fills_every_draft_position(sampler, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    values = torch.tensor([7, -1, 3], dtype=dtype) if dtype != torch.float32 else torch.tensor([0.7, -1.0, 0.25])
    cu_num_tokens = torch.tensor([2, 3, 6], dtype=torch.int32)  # 2, 1 and 3 draft positions
    expanded = sampler.expand_batch_to_tokens(values, cu_num_tokens, 6, replace_from=-1, replace_to=1)
    expected = [values[0].item()] * 2 + [1] + [values[2].item()] * 3
    assert expanded.tolist() == pytest.approx(expected)
    assert expanded.dtype == dtype


def test_sampling_constraints_scale_each_request_by_its_own_temperature(sampler):
    """apply_sampling_constraints divides each draft position's logits by its request's temperature."""
    import torch
    from vllm.v1.sample.metadata import SamplingMetadata

    logits = torch.ones(3, 4)
    metadata = SamplingMetadata(
        temperature=torch.tensor([0.5, 2.0]), all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=None,
        presence_penalties=None, repetition_penalties=None, output_token_ids=[], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=None)
    out = sampler.apply_sampling_constraints(logits, torch.tensor([1, 3], dtype=torch.int32), metadata)
    assert out[:, 0].tolist() == pytest.approx([2.0, 0.5, 0.5])


def test_applying_twice_changes_nothing(sampler):
    import sys

    from vspec_runtime.patches import _base, cpu_expand_kernel

    module = sys.modules[cpu_expand_kernel.TARGET_MODULE]
    patched = module._expand_kernel_impl
    assert cpu_expand_kernel.apply(module) is False
    assert module._expand_kernel_impl is patched and _base.is_patched(module, "_expand_kernel_impl",
                                                                       cpu_expand_kernel.NAME)
