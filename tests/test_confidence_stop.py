"""Confidence stop (lossless, per request): cut a request's draft after its first uncertain position.

Unit tests: the entropy rule, the patched proposer and runner pieces, the post-import hook that
applies them, and the scheduler/controller counting that puts each cut in the trace. Engine tests
(vLLM CPU, tiny random Qwen2 target + Qwen2 EAGLE head, fp32): with a fixed K the greedy output is
identical with and without the stop while vLLM's own counters show fewer draft tokens verified,
and the per-request cuts are in the trace; the same holds under the online policy.
"""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest

from conftest import QWEN2_MAX_TOKENS, QWEN2_PROMPTS, qwen2_request, qwen2_spec, run_offline

from vspec_runtime.patches._confidence import ConfidenceStop, trim_drafts


# --- the rule ----------------------------------------------------------------------------------


def test_topk_entropy_is_that_of_the_renormalised_top_k():
    import torch

    rule = ConfidenceStop(topk=2)
    logits = torch.tensor([[3.0, 3.0, -9.0, 0.0], [20.0, 0.0, 0.0, 0.0]])
    entropy = rule.topk_entropy(logits)
    assert math.isclose(float(entropy[0]), math.log(2), rel_tol=1e-5)  # a coin flip between two
    assert float(entropy[1]) < 1e-6  # sure
    assert float(ConfidenceStop(topk=64).topk_entropy(torch.zeros(1, 4))[0]) == pytest.approx(math.log(4))


def test_keep_lengths_stop_at_the_first_uncertain_position_and_keep_it():
    import torch

    rule = ConfidenceStop()  # cut where H * 0.15 > 0.3**2, i.e. H > 0.6 nats
    entropies = torch.tensor([[0.1, 0.65, 0.1], [0.69, 0.1, 0.1], [0.1, 0.1, 0.1], [0.1, 0.1, 0.61]])
    assert rule.keep_lengths(entropies).tolist() == [2, 1, 3, 3]
    assert ConfidenceStop(threshold=0.2, scale=1.0).keep_lengths(torch.tensor([[0.03, 0.05]])).tolist() == [2]


def test_trim_drafts_cuts_in_place():
    drafts = [[1, 2, 3], [4, 5, 6], [], [7, 8, 9]]
    assert trim_drafts(drafts, [1, 3, 2, 2]) == 3
    assert drafts == [[1], [4, 5, 6], [], [7, 8]]


# --- the patched vLLM pieces ---------------------------------------------------------------------


@pytest.fixture
def proposer_patch(monkeypatch):
    from vllm.v1.spec_decode import llm_base_proposer as module

    from vspec_runtime.patches import _base
    from vspec_runtime.patches import llm_base_proposer as patch

    originals = {name: module.SpecDecodeBaseProposer.__dict__[name] for name in ("propose", "_greedy_sample")}
    monkeypatch.setattr(patch, "_settings", None)
    patch.apply(module, ConfidenceStop())
    yield module, patch
    for name in originals:
        _base.restore(module.SpecDecodeBaseProposer, name)
    assert all(module.SpecDecodeBaseProposer.__dict__[n] is f for n, f in originals.items())


def fake_proposer(module, logits_per_call):
    import torch

    class FakeModel:
        calls = iter(logits_per_call)

        def compute_logits(self, hidden_states):
            return next(self.calls)

    proposer = object.__new__(module.SpecDecodeBaseProposer)
    proposer.model = FakeModel()
    proposer.use_local_argmax_reduction = False
    proposer.use_heterogeneous_vocab = False
    proposer.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    proposer.hidden = torch.zeros(len(logits_per_call[0]), 1)
    return proposer


def test_patched_proposer_drafts_the_same_tokens_and_records_keep_lengths(proposer_patch):
    import torch

    module, patch = proposer_patch
    sure, unsure = [9.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]
    # Two requests, K=3: request 0 is sure, then unsure at position 1; request 1 unsure at once.
    steps = [torch.tensor([sure, unsure]), torch.tensor([unsure, sure]), torch.tensor([sure, sure])]
    proposer = fake_proposer(module, steps)
    original_sample = patch._base.original_of(module.SpecDecodeBaseProposer, "_greedy_sample")

    def drafting_loop(self, num_speculative_tokens, *args, **kwargs):  # what vLLM's propose() does
        return torch.stack([self._greedy_sample(self.hidden) for _ in range(num_speculative_tokens)], dim=1)

    propose = patch._make_propose(drafting_loop)
    drafts = propose(proposer, 3)
    reference = torch.stack([original_sample(fake_proposer(module, [s]), None) for s in steps], dim=1)
    assert torch.equal(drafts, reference), "the patch changed the drafted tokens"
    kept_for, keep = getattr(proposer, patch.PENDING_CUT)
    assert kept_for is drafts and keep.tolist() == [2, 1]
    assert getattr(proposer, patch._ENTROPIES) is None, "entropies must not outlive the call"


def test_outside_propose_the_patched_greedy_sample_is_vllm_s(proposer_patch):
    import torch

    module, patch = proposer_patch
    proposer = fake_proposer(module, [torch.tensor([[0.0, 2.0, 1.0]])])
    assert module.SpecDecodeBaseProposer._greedy_sample(proposer, None).tolist() == [1]
    assert getattr(proposer, patch._ENTROPIES, None) is None


def test_runner_trims_only_the_drafts_the_cut_belongs_to():
    import torch
    from vllm.v1.outputs import DraftTokenIds

    from vspec_runtime.patches import gpu_model_runner as patch

    drafts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    runner = SimpleNamespace(drafter=SimpleNamespace(), _draft_token_ids=drafts)
    take = patch._make_take(lambda self: DraftTokenIds(["a", "b"], self._draft_token_ids.tolist()))

    setattr(runner.drafter, patch.PENDING_CUT, (drafts, torch.tensor([1, 3])))
    assert take(runner).draft_token_ids == [[1], [4, 5, 6]]
    assert getattr(runner.drafter, patch.PENDING_CUT) is None, "a cut is used once"
    assert take(runner).draft_token_ids == [[1, 2, 3], [4, 5, 6]]

    setattr(runner.drafter, patch.PENDING_CUT, (drafts, torch.tensor([1, 1])))
    runner._draft_token_ids = torch.zeros_like(drafts)  # the runner replaced the drafts (drafter skipped)
    assert take(runner).draft_token_ids == [[0, 0, 0], [0, 0, 0]]


def test_patches_wait_for_their_module_and_apply_once(tmp_path, monkeypatch):
    from vspec_runtime.patches import _hooks

    (tmp_path / "vspec_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    _hooks.when_imported("vspec_hook_probe", lambda module: seen.append(module.VALUE))
    assert seen == [] and _hooks.pending().get("vspec_hook_probe") == 1
    import vspec_hook_probe  # noqa: F401

    assert seen == [1] and "vspec_hook_probe" not in _hooks.pending()
    _hooks.when_imported("vspec_hook_probe", lambda module: seen.append("now"))  # already imported
    assert seen == [1, "now"]
    assert vspec_hook_probe.__loader__.get_source("vspec_hook_probe") == "VALUE = 1\n"
    sys.modules.pop("vspec_hook_probe")


# --- counting cuts in the engine core ------------------------------------------------------------


def test_scheduler_counts_cuts_and_controller_traces_them(tmp_path):
    from vllm.v1.outputs import DraftTokenIds

    from vspec_runtime.controller import AdaptiveController
    from vspec_runtime.scheduler import AdaptiveScheduler
    from vspec_runtime.spec import RuntimeSpec

    trace = tmp_path / "trace.jsonl"
    spec = RuntimeSpec(method="eagle", target_model="t", drafter="d", gamma=3,
                       adaptive={"enabled": True, "entropy_stop": True, "trace": str(trace)})
    controller = AdaptiveController(spec, max_gamma=3, max_batched_tokens=512)

    def request(prefill=False, finished=False):
        return SimpleNamespace(is_prefill_chunk=prefill, is_finished=lambda: finished)

    scheduler = SimpleNamespace(_vspec=controller, _vspec_drafting_k=3, requests={
        "cut": request(), "full": request(), "prefill": request(prefill=True), "done": request(finished=True)})
    drafts = DraftTokenIds(["cut", "full", "prefill", "done", "gone"], [[1], [1, 2, 3], [1], [1], [1]])
    AdaptiveScheduler._count_confidence_cuts(scheduler, drafts)
    controller.close()

    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines == [{"step": 0, "time": lines[0]["time"], "event": "confidence-stop", "gamma": 3,
                      "kept": {"cut": 1}, "dropped": 2}]
    snapshot = controller.snapshot()
    assert (snapshot["confidence_cut_requests"], snapshot["confidence_dropped_drafts"]) == (1, 2)


# --- engine level --------------------------------------------------------------------------------

MAX_TOKENS = QWEN2_MAX_TOKENS
GAMMA = 3  # qwen2_spec's


@pytest.fixture(scope="module")
def qwen2_eagle(tiny_models):
    return str(tiny_models["qwen2"]), str(tiny_models["qwen2-eagle"])


def run(tmp_path, target, head, adaptive):
    spec = qwen2_spec("eagle", target, head, adaptive=dict(adaptive, trace=str(tmp_path / "trace.jsonl")))
    return run_offline(qwen2_request(spec, target, head), tmp_path)


def token_ids(result):
    return [out["token_ids"] for phase in result["phases"] for out in phase["outputs"]]


def cut_lines(result):
    return [line for line in result["trace"] or [] if line.get("event") == "confidence-stop"]


FIXED = {"enabled": True, "policy": "fixed", "fixed_gamma": GAMMA}


@pytest.fixture(scope="module")
def without_stop(qwen2_runs):
    """The session's Qwen2 EAGLE run: fixed K, the confidence stop at its default (off), traced."""
    return qwen2_runs("eagle")


@pytest.mark.vllm
def test_fixed_k_same_output_fewer_verified_drafts_and_cuts_in_the_trace(qwen2_eagle, without_stop, tmp_path):
    with_stop = run(tmp_path, *qwen2_eagle, dict(FIXED, entropy_stop=True))

    assert token_ids(with_stop) == token_ids(without_stop), "confidence stop changed the output"
    assert all(len(ids) == MAX_TOKENS for ids in token_ids(with_stop))
    before, after = without_stop["counters"], with_stop["counters"]
    assert before["vllm:spec_decode_num_draft_tokens"] == GAMMA * before["vllm:spec_decode_num_drafts"]
    assert 0 < after["vllm:spec_decode_num_draft_tokens"] < before["vllm:spec_decode_num_draft_tokens"]
    print(f"\ndraft tokens verified: {before['vllm:spec_decode_num_draft_tokens']:.0f} without the stop, "
          f"{after['vllm:spec_decode_num_draft_tokens']:.0f} with it "
          f"({before['vllm:spec_decode_num_drafts']:.0f} / {after['vllm:spec_decode_num_drafts']:.0f} drafts)")

    cuts = cut_lines(with_stop)
    assert cuts, "no confidence-stop line in the trace"
    assert all(line["gamma"] == GAMMA and all(1 <= kept < GAMMA for kept in line["kept"].values()) for line in cuts)
    assert all(line["dropped"] == sum(GAMMA - kept for kept in line["kept"].values()) for line in cuts)
    requests_seen = {req for line in cuts for req in line["kept"]}
    assert len(requests_seen) >= len(QWEN2_PROMPTS), "cuts are per request: every request should appear"
    controller = with_stop["controller"]
    assert controller["confidence_dropped_drafts"] == sum(line["dropped"] for line in cuts)
    assert not cut_lines(without_stop) and without_stop["controller"]["confidence_dropped_drafts"] == 0


@pytest.mark.vllm
def test_confidence_stop_with_the_online_policy(qwen2_eagle, without_stop, tmp_path):
    # min_gamma 2 keeps the policy choosing among K that can be cut (a random head would soon pick 0).
    online = {"enabled": True, "policy": "online", "control_interval": 1, "min_gamma": 2, "entropy_stop": True}
    result = run(tmp_path, *qwen2_eagle, online)
    assert token_ids(result) == token_ids(without_stop)
    decisions = [line for line in result["trace"] if "event" not in line]
    assert decisions and {line["gamma"] for line in decisions} <= {2, 3}
    assert cut_lines(result) and result["controller"]["confidence_cut_requests"] > 0
