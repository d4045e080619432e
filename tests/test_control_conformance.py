"""One contract, every policy: what the scheduler may rely on (docs/architecture.md, "Extending vspec")."""

from __future__ import annotations

import json
import math
import random

import pytest

from vspec_runtime.control import (
    Decision,
    FixedPolicy,
    GuardedPolicy,
    LatencyProfile,
    OnlinePolicy,
    ProfilePolicy,
    StepFeedback,
    TablePolicy,
    make_policy,
)
from vspec_runtime.spec import AdaptiveSettings

MAX_GAMMA = 6
PROFILE = {
    "schema": "vspec-profile/1",
    "target": {"alpha": 0.00001, "c": 0.05, "delta": 20.0},
    "drafter": {"alpha": 0.0, "c": 0.01, "delta": 0.8},
    "max_gamma": MAX_GAMMA,
    "table": {"1": 6, "16": 2},
}

FACTORIES = {
    "online": lambda: make_policy(AdaptiveSettings(enabled=True), MAX_GAMMA),
    "online-plain": lambda: make_policy(AdaptiveSettings(enabled=True, model_guided=False), MAX_GAMMA),
    "online-tight": lambda: make_policy(
        AdaptiveSettings(enabled=True, min_gamma=2, control_interval=1, max_gamma_step=1, hysteresis=0.0), MAX_GAMMA
    ),
    "profile": lambda: make_policy(AdaptiveSettings(enabled=True, policy="profile", profile="p.json"), MAX_GAMMA,
                                   PROFILE),
    "fixed": lambda: make_policy(AdaptiveSettings(policy="fixed", fixed_gamma=3), MAX_GAMMA),
    "table": lambda: make_policy(AdaptiveSettings(policy="table", table={1: 6, 8: 2, 32: 0}), MAX_GAMMA),
    "raw-online": lambda: OnlinePolicy(max_gamma=MAX_GAMMA, seed=3),
    "raw-profile": lambda: ProfilePolicy(LatencyProfile.from_dict(PROFILE), max_gamma=MAX_GAMMA),
    "raw-fixed": lambda: FixedPolicy(MAX_GAMMA),
    "raw-table": lambda: TablePolicy({2: 4, 64: 1}),
    "guarded-fixed": lambda: GuardedPolicy(FixedPolicy(5), safe_gamma=1, max_gamma=MAX_GAMMA),
    "sweep": lambda: make_policy(AdaptiveSettings(enabled=True, policy="sweep", sweep_gammas=(0, 3, MAX_GAMMA),
                                                  control_interval=2), MAX_GAMMA),
}


def random_feedback(rng: random.Random, batch: int, gamma: int) -> StepFeedback:
    drafted = tuple(gamma if rng.random() > 0.1 else rng.randint(0, gamma) for _ in range(batch))
    accepted = tuple(rng.randint(0, d) for d in drafted)
    interval = rng.choice([rng.uniform(1.0, 80.0)] * 8 + [0.0, math.nan])
    return StepFeedback(
        batch_size=batch,
        gamma=gamma,
        drafted=drafted,
        accepted=accepted,
        interval_ms=interval,
        stable=rng.random() > 0.2,
        context_tokens=batch * rng.randint(0, 4000),
        batched_tokens=batch * (gamma + 1),
    )


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_policy_contract(name):
    policy = FACTORIES[name]()
    rng = random.Random(11)
    batch = 4
    for step in range(1500):
        if rng.random() < 0.05:
            batch = rng.choice([1, 2, 3, 5, 8, 13, 64, 200])
        max_feasible = rng.choice([MAX_GAMMA] * 6 + [0, 1, 3, 20])
        if rng.random() < 0.02:
            policy.decide_next(batch)  # a re-probe of a sticky K=0 asks for a decision now
        decision = policy.choose(batch, max_feasible)
        assert isinstance(decision, Decision)
        assert isinstance(decision.gamma, int) and isinstance(decision.reason, str) and decision.reason
        assert 0 <= decision.gamma <= min(max_feasible, MAX_GAMMA), (step, decision)
        assert all(isinstance(k, int) and math.isfinite(v) for k, v in decision.rewards.items())
        policy.observe(random_feedback(rng, batch, decision.gamma))
    json.dumps(policy.summary(), allow_nan=False)
    assert policy.summary()["policy"]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_observe_accepts_gamma_zero_and_odd_feedback(name):
    policy = FACTORIES[name]()
    policy.choose(3, MAX_GAMMA)
    policy.observe(StepFeedback(3, 0, (0, 0, 0), (0, 0, 0), 15.0, True))
    policy.observe(StepFeedback(3, 0, (), (), 15.0, False))  # nothing verified
    policy.observe(StepFeedback(2, 9, (9, 9), (9, 12), 15.0, True))  # K above the range, a > d
    policy.observe(StepFeedback(0, 2, (), (), 0.0, True))  # an empty step
    assert 0 <= policy.choose(3, MAX_GAMMA).gamma <= MAX_GAMMA
    json.dumps(policy.summary(), allow_nan=False)
