"""The simulator the policy tests rest on: known best K, common random numbers, determinism."""

from __future__ import annotations

import pytest

from vspec_runtime.control.simulate import (
    AcceptanceProcess,
    LatencyModel,
    OraclePolicy,
    Scenario,
    accepted_run,
    batch_dependent,
    best_fixed_gamma,
    expected_committed,
    goodput_curve,
    high_acceptance,
    phase_change,
    run,
    run_oracle,
    steps_to_readapt,
    useless_drafter,
)
from vspec_runtime.control.static import FixedPolicy


def test_expected_committed_design_example():
    assert expected_committed((0.5,), 3) == pytest.approx(1.875)
    assert expected_committed((0.9, 0.5), 2) == pytest.approx(1 + 0.9 + 0.45)


def test_accepted_run_is_monotone_in_k():
    probabilities = (0.8,) * 6
    for uniform in (0.01, 0.3, 0.6, 0.95):
        runs = [accepted_run(uniform, probabilities, gamma) for gamma in range(7)]
        assert runs == sorted(runs) and runs[0] == 0
        assert all(b - a <= 1 for a, b in zip(runs, runs[1:]))


@pytest.mark.parametrize(
    "scenario, batch, step, best",
    [
        (high_acceptance(), 4, 0, 6),
        (useless_drafter(), 4, 0, 0),
        (batch_dependent(), 1, 0, 6),
        (batch_dependent(), 8, 250, 1),
        (phase_change(), 4, 0, 6),
        (phase_change(), 4, 1500, 1),
    ],
)
def test_scenarios_have_the_documented_best(scenario, batch, step, best):
    assert scenario.batch_at(step) == batch
    assert scenario.best_gamma(step) == best
    curve = goodput_curve(scenario.acceptance.probabilities(step), scenario.latency, batch, range(7))
    runner_up = max(value for gamma, value in curve.items() if gamma != best)
    assert runner_up < 0.97 * curve[best]  # a clear best, not a coin flip


def test_oracle_beats_every_fixed_k_on_the_same_draws():
    scenario = batch_dependent()
    oracle = run_oracle(scenario).goodput_tokens_per_ms
    for gamma in range(7):
        assert run(FixedPolicy(gamma), None, scenario).goodput_tokens_per_ms < oracle


def test_common_random_numbers():
    scenario = high_acceptance(200)
    short, long = run(FixedPolicy(2), None, scenario), run(FixedPolicy(6), None, scenario)
    # Same requests: a longer draft accepts at least as much, request by request, step by step.
    assert long.tokens >= short.tokens
    again = run(FixedPolicy(2), None, scenario)
    assert (again.tokens, again.time_ms) == (short.tokens, short.time_ms)
    other_seed = run(FixedPolicy(2), None, scenario, seed=1)
    assert other_seed.tokens != short.tokens


def test_feasibility_and_unstable_steps():
    scenario = Scenario("tight", AcceptanceProcess.constant(0.8), LatencyModel(), batches=((0, 8), (10, 16)),
                        max_num_batched_tokens=64)
    assert scenario.max_feasible_gamma(8) == 6 and scenario.max_feasible_gamma(16) == 3
    seen = []

    class Recorder(FixedPolicy):
        def observe(self, feedback):
            seen.append(feedback)

    result = run(Recorder(6), 20, scenario)
    assert result.gammas[:10] == [6] * 10 and result.gammas[10:] == [3] * 10
    assert seen[0].stable is False and seen[10].stable is False  # a new batch is not a pure decode step
    assert seen[10].batched_tokens == 16 * 4


def test_best_fixed_gamma_prefers_smaller_on_ties():
    flat = LatencyModel(base_ms=10.0, verify_ms_per_token=0.0, draft_ms_per_forward=0.0)
    assert best_fixed_gamma((0.0,), flat, 4) == 0


def test_steps_to_readapt_counts_from_the_change():
    scenario = phase_change(steps=400)
    result = run(OraclePolicy(scenario), None, scenario)
    assert steps_to_readapt(result, scenario, change_step=200) == 0
    assert steps_to_readapt(run(FixedPolicy(6), None, scenario), scenario, change_step=200) is None


def test_acceptance_process_validation():
    with pytest.raises(ValueError):
        AcceptanceProcess(((5, (0.5,)),))
    with pytest.raises(ValueError):
        AcceptanceProcess.constant(1.5)
