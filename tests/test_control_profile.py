"""LatencyProfile (the vspec-profile/1 format) and ProfilePolicy."""

from __future__ import annotations

import json
import math

import pytest

from vspec_runtime.control.base import StepFeedback
from vspec_runtime.control.latency_profile import PROFILE_SCHEMA, LatencyProfile
from vspec_runtime.control.profile_policy import ProfilePolicy
from vspec_runtime.control.simulate import (
    LatencyModel,
    goodput_ratio,
    high_acceptance,
    phase_change,
    run,
    useless_drafter,
)


def profile_of(latency: LatencyModel, **extra) -> dict:
    """The profile a perfect collector would measure for the simulator's (knee-free) latency model."""
    return {
        "schema": PROFILE_SCHEMA,
        "target": {"alpha": 0.0, "c": latency.verify_ms_per_token, "delta": latency.base_ms},
        "drafter": {"alpha": 0.0, "c": latency.draft_ms_per_token, "delta": latency.draft_ms_per_forward},
        "max_gamma": 6,
        **extra,
    }


def example() -> dict:
    return {
        "schema": PROFILE_SCHEMA,
        "target": {"alpha": 0.001, "c": 0.05, "delta": 20.0},
        "drafter": {"alpha": 0.0, "c": 0.01, "delta": 1.0},
        "overhead_ms_per_k": {"0": 0.0, "2": 0.5},
        "max_gamma": 6,
        "table": {"1": 6, "8": 1},
        "meta": {"device": "test"},
    }


# -- the format ---------------------------------------------------------------------------------------


def test_round_trip():
    profile = LatencyProfile.from_dict(example())
    assert LatencyProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    assert profile.table == {1: 6, 8: 1}


def test_step_latency_formula():
    profile = LatencyProfile.from_dict(example())
    batch, gamma, context = 4, 3, 1000
    drafting = gamma * (0.0 * context + 0.01 * batch + 1.0)
    verification = 0.001 * context + 0.05 * batch * (gamma + 1) + 20.0
    assert profile.step_ms(batch, gamma, context) == pytest.approx(drafting + verification + 0.5)
    assert profile.step_ms(batch, 0, context) == pytest.approx(0.001 * context + 0.05 * batch + 20.0)


def test_overhead_uses_nearest_listed_k_below():
    profile = LatencyProfile.from_dict(example())
    assert [profile.overhead_ms(k) for k in range(5)] == [0.0, 0.0, 0.5, 0.5, 0.5]


def test_null_drafter_and_optional_sections():
    data = {"schema": PROFILE_SCHEMA, "target": {"alpha": 0, "c": 0.1, "delta": 5}, "drafter": None, "max_gamma": 4}
    profile = LatencyProfile.from_dict(data)
    assert profile.drafter is None and profile.table_gamma(3) is None
    assert profile.step_ms(2, 2) == pytest.approx(0.1 * 6 + 5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"extra": 1}, "unknown key 'extra'"),
        ({"schema": "vspec-profile/0"}, "profile.schema"),
        ({"target": {"alpha": -1.0, "c": 0.0, "delta": 1.0}}, "profile.target.alpha"),
        ({"target": {"alpha": 0.0, "c": math.inf, "delta": 1.0}}, "profile.target.c"),
        ({"target": {"alpha": 0.0, "c": math.nan, "delta": 1.0}}, "profile.target.c"),
        ({"target": {"alpha": 0.0, "c": True, "delta": 1.0}}, "profile.target.c"),
        ({"target": {"alpha": 0.0, "c": 1.0}}, "profile.target.delta: missing"),
        ({"drafter": {"alpha": 0.0, "c": 1.0, "delta": 1.0, "beta": 2}}, "unknown key 'beta'"),
        ({"max_gamma": -1}, "profile.max_gamma"),
        ({"max_gamma": 2.5}, "profile.max_gamma"),
        ({"table": {"0": 1}}, "profile.table"),
        ({"table": {"4": 9}}, "profile.table"),
        ({"table": {"x": 1}}, "profile.table"),
        ({"overhead_ms_per_k": {"1": -0.5}}, "profile.overhead_ms_per_k"),
        ({"overhead_ms_per_k": {"9": 0.5}}, "profile.overhead_ms_per_k"),
        ({"meta": "v1"}, "profile.meta"),
    ],
)
def test_validation_errors_are_one_line(change, message):
    data = {**example(), **change}
    with pytest.raises(ValueError) as error:
        LatencyProfile.from_dict(data)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_target_and_non_object():
    with pytest.raises(ValueError, match="profile.target: missing"):
        LatencyProfile.from_dict({"schema": PROFILE_SCHEMA, "max_gamma": 2})
    with pytest.raises(ValueError, match="JSON object"):
        LatencyProfile.from_dict([1, 2])


# -- the policy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [high_acceptance, useless_drafter, phase_change])
def test_exact_profile_is_near_the_oracle(factory):
    scenario = factory()
    profile = LatencyProfile.from_dict(profile_of(scenario.latency))
    ratio, _ = goodput_ratio(ProfilePolicy(profile, max_gamma=6), scenario)
    print(f"profile policy on {scenario.name}: {ratio:.4f}")
    assert ratio >= 0.98


def test_measurement_corrects_a_wrong_profile():
    scenario = useless_drafter()  # a drafter costing 3 ms per draft forward ...
    wrong = profile_of(scenario.latency)
    wrong["drafter"] = {"alpha": 0.0, "c": 0.0, "delta": 0.0}  # ... profiled as free
    policy = ProfilePolicy(LatencyProfile.from_dict(wrong), max_gamma=6)
    result = run(policy, 600, scenario)
    assert result.gammas[0] > 0  # believed the profile at first
    assert result.gammas[-1] == 0  # the measured/predicted ratio taught it otherwise
    corrections = policy.summary()["buckets"]["4"]["corrections"]
    assert all(ratio > 1.05 for k, ratio in corrections.items() if k != "0")


def test_table_is_the_prior_before_acceptance_data():
    policy = ProfilePolicy(LatencyProfile.from_dict(example()), max_gamma=6)
    assert (policy.choose(8, 6).gamma, policy.choose(1, 6).gamma) == (1, 6)
    assert policy.choose(8, 6).reason == "hold"


def test_hysteresis_and_interval():
    scenario = high_acceptance()
    profile = LatencyProfile.from_dict(profile_of(scenario.latency))
    result = run(ProfilePolicy(profile, max_gamma=6, control_interval=5), 400, scenario)
    decision_steps = [step for step, reason in enumerate(result.reasons) if reason != "hold"]
    assert all(step % 5 == 0 for step in decision_steps)
    assert result.switches <= 4


def test_infeasible_and_runtime_max_gamma():
    policy = ProfilePolicy(LatencyProfile.from_dict(example()), max_gamma=4)
    assert policy.max_gamma == 4
    assert policy.choose(1, 2).gamma == 2 and policy.choose(1, 2).reason in ("infeasible", "hold")
    policy.observe(StepFeedback(1, 2, (2,), (1,), 21.0, True, context_tokens=100))
    json.dumps(policy.summary(), allow_nan=False)


def test_rejects_bad_settings():
    profile = LatencyProfile.from_dict(example())
    with pytest.raises(ValueError, match="profile policy"):
        ProfilePolicy(profile, control_interval=0)
    with pytest.raises(ValueError, match="profile policy"):
        ProfilePolicy(profile, correction_weight=0.0)
