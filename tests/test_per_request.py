"""Per-request draft lengths (vspec_runtime/control/per_request.py): pure Python, no engine.

What a user would notice if these broke: copy rows losing their long drafts in a mixed batch, chat rows
keeping drafts that cost the whole batch time, an opted-out request still being speculated on, or a
request whose estimate fell never getting drafts again.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from vspec_runtime.control.per_request import (
    DraftAllocator,
    PooledRates,
    RequestAcceptance,
    StepCostLine,
    allocate,
)
from vspec_runtime.controller import AdaptiveController, ObservedStep
from vspec_runtime.spec import validate_spec


def _rate(kept: dict[str, int], survival: dict[str, list[float]], fixed: float, per_token: float) -> float:
    value = len(kept) + sum(sum(survival[rid][:k]) for rid, k in kept.items())
    return value / (fixed + per_token * (len(kept) + sum(kept.values())))


def _survival(rates: list[float]) -> list[float]:
    out, alive = [], 1.0
    for rate in rates:
        alive *= rate
        out.append(alive)
    return out


# --- allocate -------------------------------------------------------------------------------------


def test_allocation_keeps_the_copy_rows_drafts_and_drops_the_chat_rows():
    survival = {"copy": _survival([0.95] * 6), "chat": _survival([0.1] * 6)}
    kept = allocate({"copy": 6, "chat": 6}, survival, fixed_ms=30.0, per_token_ms=3.0)
    assert kept == {"copy": 6, "chat": 0}


def test_free_verification_keeps_every_draft_and_costly_verification_keeps_none():
    survival = {"a": _survival([0.5] * 4), "b": _survival([0.2] * 4)}
    assert allocate({"a": 4, "b": 4}, survival, fixed_ms=30.0, per_token_ms=0.0) == {"a": 4, "b": 4}
    assert allocate({"a": 4, "b": 4}, survival, fixed_ms=1.0, per_token_ms=50.0) == {"a": 0, "b": 0}


@pytest.mark.parametrize("seed", range(40))
def test_allocation_is_the_best_of_every_per_request_length_choice(seed):
    """Brute force over all (K_1..K_B): the sorted-slot rule finds the highest tokens per ms."""
    rng = random.Random(seed)
    batch, depth = rng.randint(1, 4), rng.randint(1, 4)
    offered = {f"r{i}": rng.randint(1, depth) for i in range(batch)}
    survival = {rid: _survival([rng.random() for _ in range(depth)]) for rid in offered}
    fixed, per_token = rng.uniform(1.0, 40.0), rng.uniform(0.0, 8.0)
    kept = allocate(offered, survival, fixed, per_token)
    assert all(0 <= kept[rid] <= offered[rid] for rid in offered)
    best = max(_rate(dict(zip(offered, choice)), survival, fixed, per_token)
               for choice in itertools.product(*(range(n + 1) for n in offered.values())))
    assert _rate(kept, survival, fixed, per_token) == pytest.approx(best, rel=1e-9)


# --- estimates ------------------------------------------------------------------------------------


def test_a_request_that_accepts_everything_rises_above_the_prior_and_one_that_rejects_falls():
    table = RequestAcceptance(max_positions=4)
    prior = [0.5] * 4
    for _ in range(10):
        table.observe("copy", drafted=4, accepted=4)
        table.observe("chat", drafted=4, accepted=0)
    assert table.survival("new", prior, 4) == pytest.approx(_survival(prior))
    assert table.survival("copy", prior, 4)[3] > 0.5 > 0.1 > _survival(prior)[3]
    assert table.survival("chat", prior, 1)[0] < 0.15


def test_pooled_rates_follow_the_server_and_fill_unseen_depths_from_the_last_seen():
    pooled = PooledRates(max_positions=4)
    for _ in range(200):
        pooled.observe(drafted=2, accepted=2)
    rates = pooled.rates()
    assert rates[0] > 0.95 and rates[1] > 0.95
    assert rates[3] > 0.9  # never drafted that deep: as good as the position before, not reset to 0.5


def test_step_cost_line_recovers_fixed_and_per_token_time():
    line = StepCostLine()
    rng = random.Random(1)
    for _ in range(200):
        tokens = rng.randint(8, 56)
        line.observe(tokens, 25.0 + 1.5 * tokens + rng.gauss(0.0, 0.5))
    fixed, per_token = line.line()
    assert fixed == pytest.approx(25.0, abs=1.0)
    assert per_token == pytest.approx(1.5, abs=0.05)


def test_step_cost_line_is_unknown_until_steps_differ_in_tokens():
    line = StepCostLine()
    for _ in range(50):
        line.observe(8, 30.0)
    assert line.line() is None


# --- the allocator as the scheduler uses it ----------------------------------------------------


def _teach_cost(allocator: DraftAllocator) -> None:
    for tokens in range(8, 56, 2):
        allocator.observe_step((), (), (), tokens, 20.0 + 2.0 * tokens, pure_decode=True)


def test_client_cap_of_zero_wins_over_the_allocation_and_the_probe():
    allocator = DraftAllocator(max_positions=6, probe_every=1)
    assert allocator.lengths({"a": 6, "b": 6}, caps={"b": 0}) == {"a": 6, "b": 0}  # before the cost is known
    _teach_cost(allocator)
    for _ in range(5):
        assert allocator.lengths({"a": 6, "b": 6}, caps={"b": 0})["b"] == 0


def test_a_request_trimmed_to_zero_gets_a_one_token_probe_every_probe_every_steps():
    allocator = DraftAllocator(max_positions=6, probe_every=4)
    _teach_cost(allocator)
    for _ in range(10):
        allocator.observe_step(("chat",), (6,), (0,), 14, 48.0, pure_decode=True)
    lengths = [allocator.lengths({"chat": 6}, caps={})["chat"] for _ in range(8)]
    assert lengths == [0, 0, 0, 1, 0, 0, 0, 1]


def test_finished_requests_are_forgotten():
    allocator = DraftAllocator(max_positions=4)
    allocator.observe_step(("a", "b"), (4, 4), (4, 0), 10, 30.0, pure_decode=True)
    assert len(allocator.requests) == 2
    allocator.finished(("a",))
    assert len(allocator.requests) == 1


def test_memory_stays_bounded_when_finishes_are_never_reported():
    table = RequestAcceptance(max_positions=2, max_requests=100)
    for number in range(1000):
        table.observe(f"r{number}", drafted=2, accepted=1)
    assert len(table) == 100


# --- the controller's side ------------------------------------------------------------------------


def _controller(per_request: bool) -> AdaptiveController:
    spec = validate_spec({"target_model": "demo", "method": "ngram", "gamma": 6,
                          "adaptive": {"enabled": True, "policy": "fixed", "per_request": per_request}})
    return AdaptiveController(spec, max_gamma=6, max_batched_tokens=2048)


def test_without_per_request_lengths_only_client_caps_trim():
    controller = _controller(per_request=False)
    assert controller.draft_lengths({"a": 6, "b": 6}, {}) is None
    assert controller.draft_lengths({"a": 6, "b": 6}, {"b": 2}) == {"b": 2}


def test_controller_feeds_the_allocator_and_trims_chat_rows_once_it_knows_the_cost():
    controller = _controller(per_request=True)
    clock = 0.0
    for step in range(60):
        # two requests at K=6: "copy" accepts all, "chat" none; the step time grows with verified tokens
        tokens = 2 + 6 + (6 if step % 2 else 0)
        controller.choose_gamma(2)
        drafted = (6, 6 if step % 2 else 0)
        observed = ObservedStep(drafted=drafted, accepted=(6, 0), batch_size=2, pure_decode=True,
                                scheduled_at=clock, completed_at=clock + (20 + 2.0 * tokens) / 1000.0,
                                batched_tokens=tokens, request_ids=("copy", "chat"))
        clock = observed.completed_at
        controller.observe_step(observed)
    assert controller.draft_lengths({"copy": 6, "chat": 6}, {}) == {"copy": 6, "chat": 0}
    summary = controller.snapshot()["per_request"]
    assert summary["kept_drafts"] == 6 and summary["offered_drafts"] == 12
    json.dumps(summary)  # published on /metrics: must be plain JSON


@pytest.mark.parametrize(("value", "cap"), [(0, 0), (2, 2), (3.0, 3), ("4", 4), (-1, None), (1.5, None),
                                            ("x", None), (True, None), (None, None)])
def test_client_cap_values_as_json_gives_them(value, cap):
    from vspec_runtime.vllm_adapter import draft_cap

    assert draft_cap(value) == cap
