"""Relaxed acceptance (opt-in, changes outputs): vLLM's real verification function, patched.

Unit tests call ``vllm.v1.sample.rejection_sampler.rejection_sample`` itself, patched by
vspec_runtime/patches/rejection_sampler.py, on small hand-made tensors: a draft inside the margin
is accepted, a protected token refused, the gates respected, sampled rows untouched, and with the
rule off or nothing near the top the output is vLLM's bit for bit. One engine-level test shows the
feature is off by default (greedy output identical to target-only), changes greedy outputs when
on, and respects the after_tokens gate inside the engine.

Sampled requests are checked at the function level only (strict rows, bit for bit): on vLLM 0.32
CPU, seeded sampling under EAGLE is not reproducible from one engine run to the next even without
any vspec patch, and greedy rows batched with sampled ones differ from target-only (also with
vLLM's own Llama EAGLE model), so no engine run can serve as a reference for them.
"""

from __future__ import annotations


import pytest

from conftest import QWEN2_MAX_TOKENS, qwen2_request, qwen2_spec, register_cpu_kernel_overrides, run_offline

from vspec_runtime.patches import _base
from vspec_runtime.patches._relaxed import RelaxedRule, generated_tokens

VOCAB = 8
BONUS = 7


@pytest.fixture(scope="module")
def sampler_module():
    import torch  # noqa: F401 - vLLM's CPU kernels need torch loaded first
    from vllm.v1.sample import rejection_sampler

    register_cpu_kernel_overrides()  # the CPU kernels, as a worker does
    return rejection_sampler


@pytest.fixture
def relaxed(sampler_module):
    """Apply the real patch with a given rule; restore vLLM's function afterwards."""
    from vspec_runtime.patches import rejection_sampler as patch

    original = sampler_module.rejection_sample

    def apply(**rule):
        _base.restore(sampler_module, "rejection_sample")
        patch.apply(sampler_module, RelaxedRule(**rule))
        return sampler_module.rejection_sample

    yield apply
    _base.restore(sampler_module, "rejection_sample")
    assert sampler_module.rejection_sample is original


def metadata(temperatures):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    count = len(temperatures)
    all_greedy = all(t == 0 for t in temperatures)
    return SamplingMetadata(
        temperature=None if all_greedy else torch.tensor(temperatures, dtype=torch.float32),
        all_greedy=all_greedy, all_random=all(t > 0 for t in temperatures), top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(count), presence_penalties=torch.zeros(count),
        repetition_penalties=torch.ones(count), output_token_ids=[[] for _ in temperatures],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def verify(function, rows, temperatures=None):
    """rows: per request, a list of (draft token, {token: logit}) positions. Returns output lists."""
    import torch

    temperatures = temperatures or [0.0] * len(rows)
    drafts, logits, counts = [], [], []
    for positions in rows:
        counts.append(len(positions))
        for draft, scores in positions:
            drafts.append(draft)
            row = torch.zeros(VOCAB)
            for token, value in scores.items():
                row[token] = value
            logits.append(row)
    target_logits = torch.stack(logits) if logits else torch.zeros(0, VOCAB)
    cumulative = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    bonus = torch.full((len(rows), 1), BONUS, dtype=torch.int64)
    torch.manual_seed(0)
    output = function(torch.tensor(drafts, dtype=torch.int32), counts, max(counts), cumulative, None,
                      target_logits, bonus, metadata(temperatures))
    return [[t for t in row if t != -1] for row in output.tolist()]


# Request 0: position 0 drafts token 2 while the target prefers 1 by 0.5 logits; positions 1 and 2
# match the target exactly. Strict verification stops at position 0 and emits the target's 1.
NEAR_MISS_FIRST = [(2, {1: 5.0, 2: 4.5}), (3, {3: 5.0}), (4, {4: 5.0})]
STRICT = [1]
RELAXED_ALL = [2, 3, 4, BONUS]


def test_strict_vllm_output_is_what_the_cases_assume(sampler_module):
    assert verify(sampler_module.rejection_sample, [NEAR_MISS_FIRST]) == [STRICT]


def test_a_draft_inside_the_margin_is_accepted(relaxed):
    assert verify(relaxed(margin=1.0), [NEAR_MISS_FIRST]) == [RELAXED_ALL]


def test_a_draft_outside_the_margin_is_refused(relaxed):
    assert verify(relaxed(margin=0.3), [NEAR_MISS_FIRST]) == [STRICT]


def test_a_draft_in_the_target_top_k_is_accepted(relaxed):
    assert verify(relaxed(topk=2), [NEAR_MISS_FIRST]) == [RELAXED_ALL]
    assert verify(relaxed(topk=1), [NEAR_MISS_FIRST]) == [STRICT]


def test_verification_continues_after_a_relaxed_token_and_stops_at_a_real_miss(relaxed):
    rows = [[(2, {1: 5.0, 2: 4.5}), (5, {3: 9.0}), (4, {4: 5.0})]]  # position 1 is far off
    assert verify(relaxed(margin=1.0), rows) == [[2, 3]]


def test_a_protected_token_is_refused_unless_it_is_the_target_choice(relaxed):
    assert verify(relaxed(margin=1.0, protected_token_ids=(2,)), [NEAR_MISS_FIRST]) == [STRICT]
    # Protection only limits relaxation: a protected token the target itself picks is accepted.
    exact = [(2, {2: 5.0}), (3, {3: 5.0, 2: 4.8})]
    assert verify(relaxed(margin=1.0, protected_token_ids=(2,)), [exact]) == [[2, 3, BONUS]]


def test_the_position_gate(relaxed):
    assert verify(relaxed(margin=1.0, from_position=1), [NEAR_MISS_FIRST]) == [STRICT]
    near_miss_second = [(3, {3: 5.0}), (2, {1: 5.0, 2: 4.5}), (4, {4: 5.0})]
    assert verify(relaxed(margin=1.0, from_position=1), [near_miss_second]) == [[3, 2, 4, BONUS]]


def test_the_generated_tokens_gate(relaxed):
    function = relaxed(margin=1.0, after_tokens=10)
    assert verify(function, [NEAR_MISS_FIRST]) == [STRICT], "no token counts: the gate must refuse"
    with generated_tokens([9]):
        assert verify(function, [NEAR_MISS_FIRST]) == [STRICT]  # 9 tokens precede position 0
        near_miss_second = [(3, {3: 5.0}), (2, {1: 5.0, 2: 4.5})]
        assert verify(function, [near_miss_second]) == [[3, 2, BONUS]]  # 10 precede position 1
    with generated_tokens([10]):
        assert verify(function, [NEAR_MISS_FIRST]) == [RELAXED_ALL]


def test_invalid_drafts_are_never_accepted(relaxed):
    rows = [[(-1, {1: 5.0}), (3, {3: 5.0})]]  # -1: a draft vLLM invalidated (structured output)
    assert verify(relaxed(margin=100.0), rows) == [[1]]


def test_sampled_requests_keep_strict_verification(relaxed, sampler_module):
    rows = [NEAR_MISS_FIRST, [(2, {1: 5.0, 2: 4.5}), (3, {3: 5.0})]]
    temperatures = [0.0, 0.8]  # request 1 samples
    strict = verify(sampler_module.rejection_sample, rows, temperatures)
    patched = verify(relaxed(margin=1.0), rows, temperatures)
    assert patched[0] == RELAXED_ALL
    assert patched[1] == strict[1], "a sampled request's verification changed"
    assert verify(relaxed(margin=1.0), rows, [0.8, 0.8]) == verify(sampler_module.rejection_sample, rows, [0.8, 0.8])


def test_batches_with_uneven_drafts_touch_only_the_relaxed_rows(relaxed, sampler_module):
    rows = [[(4, {4: 5.0})], [], NEAR_MISS_FIRST, [(6, {5: 5.0, 6: -3.0})]]
    strict = verify(sampler_module.rejection_sample, rows)
    patched = verify(relaxed(margin=1.0), rows)
    assert patched == [strict[0], strict[1], RELAXED_ALL, strict[3]]


def test_nothing_near_the_top_means_vllm_output_bit_for_bit(relaxed, sampler_module):
    import torch

    torch.manual_seed(3)
    rows = [[(int(torch.randint(VOCAB, ())), {t: float(torch.randn(())) * 4 for t in range(VOCAB)})
             for _ in range(3)] for _ in range(5)]
    strict = verify(sampler_module.rejection_sample, rows)
    assert verify(relaxed(margin=1e-9), rows) == strict
    assert verify(relaxed(), rows) == strict  # rule off


def test_the_patch_applies_once_keeps_the_original_and_names_drift(sampler_module, monkeypatch):
    from vspec_runtime import vllm_surface
    from vspec_runtime.patches import rejection_sampler as patch

    original = sampler_module.rejection_sample
    try:
        assert patch.apply(sampler_module, RelaxedRule(margin=1.0)) is True
        patched = sampler_module.rejection_sample
        assert patch.apply(sampler_module) is False and sampler_module.rejection_sample is patched
        assert _base.original_of(sampler_module, "rejection_sample") is original
        # The drift check still sees vLLM's own signature through the wrapper.
        sym = next(s for s in vllm_surface.SURFACE if s.target == patch.SYMBOLS[0])
        assert vllm_surface.problem(sym) is None
    finally:
        _base.restore(sampler_module, "rejection_sample")
    assert sampler_module.rejection_sample is original

    monkeypatch.setattr(vllm_surface, "problem", lambda sym, *a: "rejection_sample takes (x), expected (draft_token_ids, ...)")
    with pytest.raises(_base.IncompatibleVllm, match="relaxed-acceptance.*rejection_sample takes"):
        patch.apply(sampler_module, RelaxedRule(margin=1.0))
    assert sampler_module.rejection_sample is original, "a drifted target must be left untouched"


def test_apply_all_enables_relaxed_patches_only_when_asked(monkeypatch):
    from vspec_runtime import patches
    from vspec_runtime.spec import RuntimeSpec

    base = {"method": "eagle", "target_model": "t", "drafter": "d"}
    # cpu-expand-kernel fixes sampled requests under any speculation (strict too): always on here.
    assert [e.name for e in patches.enabled_for(RuntimeSpec(**base))] == ["cpu-expand-kernel", "qwen2-eagle-models"]
    on = RuntimeSpec(**base, relaxed={"margin": 1.0})
    assert {e.name for e in patches.enabled_for(on)} == {"cpu-expand-kernel", "qwen2-eagle-models", "relaxed-acceptance"}
    gated = RuntimeSpec(**base, relaxed={"topk": 2, "after_tokens": 16})
    assert "relaxed-acceptance-token-counts" in {e.name for e in patches.enabled_for(gated)}


def test_metrics_say_relaxed_acceptance_is_on(monkeypatch, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from vspec_runtime import metrics
    from vspec_runtime.controller import AdaptiveController
    from vspec_runtime.spec import RuntimeSpec

    monkeypatch.setenv("VSPEC_RUN_DIR", str(tmp_path))
    spec = RuntimeSpec(method="eagle", target_model="t", drafter="d", adaptive={"enabled": True},
                       relaxed={"margin": 1.0})
    metrics.publish(AdaptiveController(spec, max_gamma=4, max_batched_tokens=512).snapshot())
    registry = CollectorRegistry()
    registry.register(metrics.VspecCollector())
    text = generate_latest(registry).decode()
    assert 'relaxed_acceptance="on"' in text and "vspec_relaxed_acceptance_enabled 1.0" in text


# --- engine level ----------------------------------------------------------------------------

AFTER_TOKENS = 4


def batch_ids(result: dict) -> list[list[int]]:
    return [out["token_ids"] for out in result["phases"][0]["outputs"]]


@pytest.mark.vllm
def test_engine_relaxed_is_off_by_default_changes_greedy_outputs_when_on_and_keeps_its_gate(tiny_models, qwen2_runs,
                                                                                            tmp_path):
    target, head = str(tiny_models["qwen2"]), str(tiny_models["qwen2-eagle"])
    # Target-only and the EAGLE head with relaxed acceptance left at its default: the session's shared runs.
    target_only, off = qwen2_runs("target-only"), qwen2_runs("eagle")
    # A margin this wide accepts every draft of a random head (the most visible change there is),
    # but only once AFTER_TOKENS output tokens precede the draft.
    relaxed = qwen2_spec("eagle", target, head, relaxed={"margin": 1000.0, "after_tokens": AFTER_TOKENS})
    on = run_offline(qwen2_request(relaxed, target, head), tmp_path)

    assert batch_ids(off) == batch_ids(target_only), "relaxed acceptance is off by default: lossless"
    assert off["controller"]["relaxed"] is False
    assert batch_ids(on) != batch_ids(off), "relaxed acceptance on did not change any greedy output"
    assert [ids[:AFTER_TOKENS] for ids in batch_ids(on)] == [ids[:AFTER_TOKENS] for ids in batch_ids(target_only)], \
        "a draft was relaxed before the request had generated after_tokens tokens"
    assert all(len(ids) == QWEN2_MAX_TOKENS for ids in batch_ids(on))
    assert on["controller"]["relaxed"] is True  # what /metrics shows as vspec_info{relaxed_acceptance="on"}
