"""make_policy: settings -> a guarded policy."""

from __future__ import annotations

import pytest

from vspec_runtime.control import FixedPolicy, GuardedPolicy, OnlinePolicy, ProfilePolicy, TablePolicy, make_policy
from vspec_runtime.spec import AdaptiveSettings

PROFILE = {"schema": "vspec-profile/1", "target": {"alpha": 0, "c": 0.05, "delta": 20}, "drafter": None,
           "max_gamma": 4}


@pytest.mark.parametrize(
    "settings, inner_type",
    [
        (AdaptiveSettings(enabled=True), OnlinePolicy),
        (AdaptiveSettings(enabled=True, policy="profile", profile="x.json"), ProfilePolicy),
        (AdaptiveSettings(policy="fixed", fixed_gamma=2), FixedPolicy),
        (AdaptiveSettings(policy="table", table={1: 4, 8: 1}), TablePolicy),
    ],
)
def test_builds_the_named_policy_guarded(settings, inner_type):
    policy = make_policy(settings, 6, PROFILE)
    assert isinstance(policy, GuardedPolicy)
    assert isinstance(policy.inner, inner_type)
    assert policy.name == policy.inner.name


def test_online_gets_the_settings():
    adaptive = AdaptiveSettings(enabled=True, min_gamma=1, control_interval=7, model_guided=False, seed=9)
    inner = make_policy(adaptive, 5).inner
    assert (inner.config.max_gamma, inner.config.min_gamma, inner.config.control_interval) == (5, 1, 7)
    assert inner.config.model_guided is False and inner.config.seed == 9


def test_profile_policy_needs_a_profile():
    with pytest.raises(ValueError, match="profile"):
        make_policy(AdaptiveSettings(enabled=True, policy="profile", profile="x.json"), 6)


def test_bad_profile_is_a_value_error():
    with pytest.raises(ValueError, match="profile.schema"):
        make_policy(AdaptiveSettings(enabled=True, policy="profile", profile="x.json"), 6, {"schema": "nope"})


def test_profile_max_gamma_limits_the_runtime_one():
    policy = make_policy(AdaptiveSettings(enabled=True, policy="profile", profile="x.json"), 6, PROFILE)
    assert policy.inner.max_gamma == 4


def test_safe_gamma_is_fixed_gamma_else_max_gamma():
    assert make_policy(AdaptiveSettings(enabled=True), 6).safe_gamma == 6
    assert make_policy(AdaptiveSettings(enabled=True, fixed_gamma=2), 6).safe_gamma == 2


def test_fixed_defaults_to_max_gamma():
    assert make_policy(AdaptiveSettings(policy="fixed"), 5).inner.gamma == 5


def test_table_entries_are_capped_to_max_gamma():
    policy = make_policy(AdaptiveSettings(policy="table", table={1: 9}), 4)
    assert policy.choose(1, 16).gamma == 4


@pytest.mark.parametrize("max_gamma", [-1, 2.5])
def test_rejects_bad_max_gamma(max_gamma):
    with pytest.raises(ValueError, match="max_gamma"):
        make_policy(AdaptiveSettings(), max_gamma)


def test_rejects_min_gamma_above_max_gamma():
    with pytest.raises(ValueError, match="min_gamma"):
        make_policy(AdaptiveSettings(min_gamma=5), 3)


def test_table_policy_without_table():
    with pytest.raises(ValueError, match="table"):
        make_policy(AdaptiveSettings(policy="table"), 4)
