"""A single stalled step (GC pause, noisy neighbour) must not make the online policy abandon a K.

Seen on a loaded machine: one 100x-slow step on an arm wrote it off for the rest of the run, since
an arm the policy stops visiting is never measured again.
"""

from vspec_runtime.control import OnlinePolicy
from vspec_runtime.control.base import StepFeedback

MAX_GAMMA = 6


def step_ms(gamma: int) -> float:
    return 10.0 + 1.0 * gamma  # verification grows slowly with K; every draft is accepted


def run(stall_at_gamma: int | None, steps: int = 600) -> list[int]:
    policy = OnlinePolicy(max_gamma=MAX_GAMMA, seed=0)
    chosen, stalled, previous = [], False, None
    for _ in range(steps):
        gamma = policy.choose(1, MAX_GAMMA).gamma
        interval = step_ms(gamma)
        if gamma == stall_at_gamma and not stalled and previous == gamma:
            interval, stalled = 100 * interval, True
        policy.observe(StepFeedback(batch_size=1, gamma=gamma, drafted=(gamma,), accepted=(gamma,),
                                    interval_ms=interval, stable=previous == gamma))
        chosen.append(gamma)
        previous = gamma
    return chosen


def test_without_a_stall_the_policy_runs_the_top_k():
    assert run(None)[-100:].count(MAX_GAMMA) >= 95


def test_one_stalled_step_on_the_best_k_does_not_write_it_off():
    assert run(MAX_GAMMA)[-100:].count(MAX_GAMMA) >= 95
