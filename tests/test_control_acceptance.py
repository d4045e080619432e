"""AcceptanceStats: per-position conditional rates and E[K] (docs/architecture.md, "Controller maths")."""

from __future__ import annotations

import random

import pytest

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.simulate import accepted_run, expected_committed


def feed(stats: AcceptanceStats, rate: float, gamma: int, steps: int, batch: int = 4, seed: int = 0) -> None:
    rng = random.Random(seed)
    probabilities = (rate,) * max(1, gamma)
    for _ in range(steps):
        accepted = [accepted_run(rng.random(), probabilities, gamma) for _ in range(batch)]
        stats.update([gamma] * batch, accepted)


def test_prior_gives_the_design_example():
    stats = AcceptanceStats(6)
    assert stats.expected_committed(0) == 1.0
    assert stats.expected_committed(3) == pytest.approx(1.875)  # p = 0.5 everywhere
    assert stats.rates(3) == [0.5, 0.5, 0.5]


def test_successes_then_one_failure_then_unobserved():
    stats = AcceptanceStats(4, prior_weight=1e-6)
    stats.update([4], [2])  # positions 1, 2 accepted; 3 rejected; 4 not observed
    assert stats.evidence(1) == pytest.approx(1.0)
    assert stats.evidence(2) == pytest.approx(1.0)
    assert stats.evidence(3) == pytest.approx(1.0)
    assert stats.evidence(4) == pytest.approx(0.0)
    assert stats.rate(1) == pytest.approx(0.999)  # the ceiling: one success is not certainty
    assert stats.rate(3) == pytest.approx(0.0, abs=1e-3)


def test_fully_accepted_draft_has_no_failure():
    stats = AcceptanceStats(4, prior_weight=1e-6)
    stats.update([2, 2], [2, 2])
    assert stats.evidence(3) == 0.0  # a = d: nothing past the draft was tried
    assert stats.rate(2) == pytest.approx(0.999)  # the ceiling keeps E[K] finite


def test_expected_committed_matches_chain_rule():
    stats = AcceptanceStats(6)
    feed(stats, 0.8, gamma=6, steps=400)
    rates = stats.rates(6)
    reach, expected = 1.0, 1.0
    for rate in rates:
        reach *= rate
        expected += reach
    assert stats.expected_committed(6) == pytest.approx(expected)
    assert stats.expected_committed_curve()[6] == pytest.approx(expected)


@pytest.mark.parametrize("rate", [0.2, 0.6, 0.9])
def test_converges_to_the_true_rate(rate):
    stats = AcceptanceStats(6)
    feed(stats, rate, gamma=6, steps=600, batch=8, seed=3)
    truth = expected_committed((rate,) * 6, 6)
    assert stats.expected_committed(6) == pytest.approx(truth, rel=0.08)
    assert stats.rate(1) == pytest.approx(rate, abs=0.07)


def test_notices_a_phase_change_within_a_few_dozen_steps():
    stats = AcceptanceStats(6)
    feed(stats, 0.9, gamma=6, steps=300, seed=1)
    stats.rate(1)
    assert stats.phase_changes == 0  # a steady phase raises no alarm
    feed(stats, 0.25, gamma=6, steps=40, seed=2)
    assert stats.rate(1) == pytest.approx(0.25, abs=0.1)
    assert stats.expected_committed(6) < 1.6  # 0.9 would give 5.2
    assert stats.phase_changes >= 1  # what tells the online policy to forget its arm costs


def test_undrafted_positions_follow_the_drafted_one():
    stats = AcceptanceStats(6)
    feed(stats, 0.3, gamma=6, steps=200, seed=1)  # every position seen at 0.3
    feed(stats, 0.9, gamma=1, steps=200, seed=2)  # then only position 1, which rises
    # p_2.. were last seen at 0.3 alongside p_1 = 0.3; they move with p_1 instead of staying there.
    assert stats.rate(2) > 0.7
    assert stats.expected_committed(4) > 3.0


def test_at_k0_the_model_drifts_back_to_its_prior():
    stats = AcceptanceStats(4)
    feed(stats, 0.05, gamma=2, steps=50)
    low = stats.rate(1)
    stats_k0 = [stats.update([0, 0, 0, 0], [0, 0, 0, 0]) for _ in range(400)]
    assert stats_k0 and low < 0.15 < stats.rate(1) < 0.5


def test_bad_counts_are_clipped_not_trusted():
    stats = AcceptanceStats(3)
    stats.update([2, -1, 9], [5, 3, -2])  # accepted > drafted, negatives, beyond max_positions
    assert all(0.0 <= rate <= 1.0 for rate in stats.rates())
    assert stats.evidence(1) == pytest.approx(2.0)  # requests 1 (a=2, d=2) and 3 (a=0, d=3)


def test_memory_is_bounded_by_positions():
    stats = AcceptanceStats(6)
    feed(stats, 0.7, gamma=6, steps=3000, batch=2)
    assert len(stats._successes) == len(stats._trials) == 7
    assert stats.updates == 3000


def test_summary_is_plain_data():
    stats = AcceptanceStats(3)
    stats.update([3], [1])
    summary = stats.summary()
    assert set(summary) == {"rates", "evidence_trials", "expected_committed", "total_trials", "phase_changes"}
    assert len(summary["expected_committed"]) == 4


@pytest.mark.parametrize(
    "kwargs",
    [{"max_positions": 0}, {"prior_rate": 1.5}, {"prior_weight": 0}, {"memory_requests": 0.5},
     {"steady_memory_requests": 8.0}, {"change_z": 0}],
)
def test_rejects_bad_settings(kwargs):
    settings = {"max_positions": 4, **kwargs}
    with pytest.raises(ValueError):
        AcceptanceStats(settings.pop("max_positions"), **settings)
