"""The online policy reads E[K] for the requests in the batch, not for recent requests in general.

A closed batch drains: the requests that accept least are left last. The pooled acceptance model,
filled by the fast requests that finished, keeps K high for them; the batch's own E[K] does not.
"""

from __future__ import annotations

from vspec_runtime.control.base import StepFeedback
from vspec_runtime.control.batch_acceptance import BatchAcceptance
from vspec_runtime.control.online import OnlinePolicy

FAST = tuple(f"fast-{i}" for i in range(4))  # accept every draft
SLOW = tuple(f"slow-{i}" for i in range(4))  # accept none


def step_ms(batch: int, gamma: int) -> float:
    """A verification-bound step: every verified token costs, so useless drafts are expensive."""
    return 10.0 + 1.0 * batch * (gamma + 1)


def mixed_step(gamma: int, requests: tuple[str, ...]) -> StepFeedback:
    accepted = tuple(gamma if request.startswith("fast") else 0 for request in requests)
    return StepFeedback(batch_size=len(requests), gamma=gamma, drafted=(gamma,) * len(requests) if gamma else (),
                        accepted=accepted if gamma else (), interval_ms=step_ms(len(requests), gamma), stable=True,
                        request_ids=requests if gamma else (), batch_ids=requests)


def run(policy: OnlinePolicy, requests: tuple[str, ...], steps: int) -> list[int]:
    chosen = []
    for _ in range(steps):
        gamma = policy.choose(len(requests), 6).gamma
        chosen.append(gamma)
        policy.observe(mixed_step(gamma, requests))
    return chosen


def test_new_requests_read_the_pooled_curve():
    tracker = BatchAcceptance(6)
    pooled_rates = [0.8] * 6
    pooled_curve = [1.0, 1.8, 2.44, 2.952, 3.3616, 3.68928, 3.951424]
    tracker.observe(StepFeedback(batch_size=2, gamma=0, drafted=(), accepted=(), interval_ms=10.0, stable=True,
                                 batch_ids=("a", "b")))
    assert tracker.expected_committed_curve(pooled_rates, pooled_curve) == pytest_approx(pooled_curve)


def test_the_requests_left_in_a_draining_batch_get_their_own_curve():
    policy = OnlinePolicy(max_gamma=6)
    run(policy, FAST + SLOW, 40)
    policy.observe(mixed_step(4, SLOW))  # the fast requests finished; the slow ones run on
    pooled = policy.acceptance.expected_committed_curve()
    batch = policy.expected_committed_curve()
    assert pooled[1] > 1.4, "the pooled model should still believe in drafts: the test would prove nothing"
    # The slow requests never accepted a first draft: about one token a step at any K (their deeper
    # positions were never reached, so those rates stay the pooled ones, behind a first rate near 0).
    assert batch[1] < 1.15, f"the slow requests accepted nothing, yet the batch curve expects {batch[1]:.2f} at K=1"
    assert batch[6] < 0.75 * pooled[6]


def test_a_draining_batch_lowers_k_sooner_than_the_pooled_model():
    tails = {}
    for batch_acceptance in (True, False):
        policy = OnlinePolicy(max_gamma=6, batch_acceptance=batch_acceptance)
        head = run(policy, FAST + SLOW, 60)
        assert head[-1] >= 4, f"batch 8 half fast should run deep drafts, ran {head[-20:]}"
        tails[batch_acceptance] = run(policy, SLOW, 28)
    assert tails[True][-1] == tails[False][-1] == 0, f"useless drafts should stop: {tails}"
    first_low = {key: next(i for i, gamma in enumerate(tail) if gamma <= 1) for key, tail in tails.items()}
    assert first_low[True] < first_low[False], f"batch-aware tail K {tails[True]} vs pooled {tails[False]}"
    assert sum(tails[True]) < sum(tails[False])


def pytest_approx(values):
    import pytest

    return pytest.approx(values, rel=1e-9)


def test_a_large_batch_reads_the_pooled_curve_and_tracks_nobody():
    # Bookkeeping every request of a large batch cost three times the policy's budget per step, for
    # a batch that reads close to the pooled model anyway: past 32 requests nothing is tracked.
    requests = tuple(f"fast-{i}" if i % 4 == 1 else f"slow-{i}" for i in range(256))
    tracker = BatchAcceptance(6)
    tracker.observe(mixed_step(4, requests[:8]))
    assert len(tracker.requests) == 8
    for _ in range(5):
        tracker.observe(mixed_step(4, requests))
    assert len(tracker.requests) == 0, "a batch of 256 should leave no per-request records"
    pooled_rates, pooled_curve = [0.8] * 6, [1.0, 1.8, 2.44, 2.952, 3.3616, 3.68928, 3.951424]
    assert tracker.expected_committed_curve(pooled_rates, pooled_curve) == pytest_approx(pooled_curve)


def test_the_slow_requests_a_large_batch_leaves_get_their_own_curve_within_a_few_steps():
    requests = FAST * 10 + SLOW * 10  # 80 requests: more than are tracked
    requests = tuple(f"{request}-{copy}" for copy, request in enumerate(requests))
    slow_left = tuple(request for request in requests if request.startswith("slow"))[:8]
    tracker = BatchAcceptance(6)
    for _ in range(20):
        tracker.observe(mixed_step(4, requests))
    pooled_rates, pooled_curve = [0.8] * 6, [1.0, 1.8, 2.44, 2.952, 3.3616, 3.68928, 3.951424]
    for _ in range(3):
        tracker.observe(mixed_step(4, slow_left))
    curve = tracker.expected_committed_curve(pooled_rates, pooled_curve)
    assert tracker.batch == slow_left
    assert curve[1] < 1.4, f"three rejected first drafts each should pull K=1 well below the pooled 1.8: {curve[1]:.2f}"
