"""The simulator the policy tests rest on: known best K, common random numbers, determinism."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vspec_runtime.control.simulate import (
    AcceptanceProcess,
    LatencyModel,
    OraclePolicy,
    Scenario,
    accepted_run,
    batch_dependent,
    best_fixed_gamma,
    continuous_load,
    expected_committed,
    goodput_curve,
    high_acceptance,
    phase_change,
    poisson_stream,
    run,
    run_oracle,
    steps_to_readapt,
    useless_drafter,
    wandering_machine,
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


def test_a_wandering_machine_slows_every_policy_alike():
    scenario = wandering_machine(400)
    steady = replace(scenario, latency=replace(scenario.latency, level_sd=0.0))
    wandering, still = run(FixedPolicy(2), None, scenario), run(FixedPolicy(2), None, steady)
    assert wandering.tokens == still.tokens, "the level must not draw from the requests' or the noise's generator"
    assert wandering.time_ms != still.time_ms
    # The level is a property of the step, not of the policy: two runs at the same K see the same one,
    # and a run at another K sees the same level too (its time differs only by what K costs).
    assert run(FixedPolicy(2), None, scenario).time_ms == wandering.time_ms
    ratio_wandering = run(FixedPolicy(3), None, scenario).time_ms / wandering.time_ms
    ratio_still = run(FixedPolicy(3), None, steady).time_ms / still.time_ms
    assert ratio_wandering == pytest.approx(ratio_still, rel=0.02)


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


def test_continuous_load_has_the_documented_best_k():
    scenario = continuous_load()
    best = {batch: best_fixed_gamma((0.75,), scenario.latency, batch) for batch in (2, 4, 6, 8, 12, 16)}
    assert best == {2: 6, 4: 3, 6: 3, 8: 2, 12: 2, 16: 2}


def test_poisson_stream_is_seeded_first_come_first_served_and_never_empty():
    stream = poisson_stream(3000, arrivals_per_step=0.3, mean_steps=60, max_batch=8, seed=4)
    assert stream == poisson_stream(3000, arrivals_per_step=0.3, mean_steps=60, max_batch=8, seed=4)
    assert stream != poisson_stream(3000, arrivals_per_step=0.3, mean_steps=60, max_batch=8, seed=5)
    assert all(1 <= len(stream.at(step)) <= 8 for step in range(3000))
    assert max(len(stream.at(step)) for step in range(3000)) == 8  # 18 would run at once: the rest queue
    admitted = [max(stream.at(step)) for step in range(3000)]
    assert admitted == sorted(admitted)  # in arrival order


def test_a_step_that_admits_a_request_is_not_pure_decode():
    scenario = continuous_load(300)
    seen = []

    class Recorder(FixedPolicy):
        def observe(self, feedback):
            seen.append(feedback)

    run(Recorder(3), None, scenario)
    for step, feedback in enumerate(seen):
        assert len(feedback.batch_ids) == scenario.batch_at(step) == feedback.batch_size
        if scenario.stream.admits_at(step):
            assert not feedback.stable


class ZeroThenThree(FixedPolicy):
    """K=0 for the first 50 steps, then 3; records what each step told it."""

    def __init__(self):
        super().__init__(0)
        self.seen = []

    def choose(self, batch_size, max_feasible_gamma):
        self.gamma = 0 if len(self.seen) < 50 else 3
        return super().choose(batch_size, max_feasible_gamma)

    def observe(self, feedback):
        self.seen.append(feedback)


def test_a_skipped_drafter_leaves_its_requests_unable_to_draft():
    """With ``drafter_skipped_at_zero``, the requests of a pure decode K=0 step never draft again;
    requests admitted later do. Without it, K=0 leaves no trace."""
    plain, skipped = ZeroThenThree(), ZeroThenThree()
    run(plain, None, continuous_load(400))
    run(skipped, None, continuous_load(400, drafter_skipped_at_zero=True))
    assert all(len(step.request_ids) == step.batch_size for step in plain.seen[50:])
    running_at_zero = set(skipped.seen[49].batch_ids)
    for step in skipped.seen[50:]:
        assert set(step.request_ids) == set(step.batch_ids) - running_at_zero
    assert 0 < sum(len(step.request_ids) for step in skipped.seen) < sum(len(step.request_ids) for step in plain.seen)
