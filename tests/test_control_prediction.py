"""Cost prediction for unmeasured arms, the sliding window and the bucket rule."""

from __future__ import annotations

import pytest

from vspec_runtime.control.prediction import predict_cost, predict_from_neighbour
from vspec_runtime.control.window import ArmWindow, bucket_of


def arms(*pairs: tuple[int, float]) -> list[tuple[int, float, float]]:
    return [(gamma, cost, cost) for gamma, cost in pairs]


def linear(gamma: int) -> float:
    return 5.0 + 0.5 * gamma


def knee(gamma: int) -> float:
    """Free up to K = 1, then 2 ms per draft token: verification turns compute-bound."""
    return 2.5 + 2.0 * max(0, gamma - 1)


@pytest.mark.parametrize("bucket, batch", [(1, 0), (1, 1), (2, 2), (4, 3), (4, 4), (8, 5), (8, 8), (64, 33)])
def test_bucket_is_next_power_of_two(bucket, batch):
    assert bucket_of(batch) == bucket


def test_window_is_a_ratio_of_sums_and_forgets_the_oldest():
    window = ArmWindow(2)
    window.add(requests=4, interval_ms=10.0, tokens=8, step=1)
    window.add(requests=4, interval_ms=30.0, tokens=8, step=2)
    assert window.goodput_tokens_per_ms == pytest.approx(16 / 40)  # not the mean of 0.8 and 0.27
    window.add(requests=2, interval_ms=10.0, tokens=2, step=3)
    assert window.count == 2 and window.total_samples == 3
    assert window.goodput_tokens_per_ms == pytest.approx(10 / 40)
    assert window.ms_per_request_step == pytest.approx(40 / 6)
    assert window.last_step == 3


def test_window_noise_estimate():
    window = ArmWindow(8)
    assert window.relative_cost_variance() is None
    for interval in (9.0, 11.0, 9.0, 11.0):
        window.add(1, interval, 1, 0)
    assert window.relative_cost_variance() == pytest.approx((4 / 3) / 100)


def test_secant_interpolates_and_extrapolates_a_line():
    measured = arms((2, linear(2)), (4, linear(4)))
    for gamma in (0, 3, 6):
        prediction = predict_cost(gamma, measured, prior_slope_fraction=0.05, tolerance=0.05)
        assert prediction.point_ms == pytest.approx(linear(gamma))
        assert prediction.optimistic_ms <= prediction.point_ms


def test_optimism_finds_a_knee_hidden_between_two_arms():
    measured = arms((0, knee(0)), (2, knee(2)), (4, knee(4)))
    prediction = predict_cost(1, measured, prior_slope_fraction=0.05, tolerance=0.0)
    assert prediction.point_ms > knee(1) * 1.3  # the secant overestimates the cost ...
    assert prediction.optimistic_ms <= knee(1)  # ... the convex bound does not


def test_optimistic_is_below_the_truth_for_a_convex_cost():
    measured = arms(*((gamma, knee(gamma)) for gamma in (3, 5)))
    for gamma in (0, 1, 2, 4, 6):
        assert predict_cost(gamma, measured, prior_slope_fraction=0.05, tolerance=0.0).optimistic_ms <= knee(gamma)


def test_one_arm_bounds_are_wide():
    measured = arms((4, 10.0))
    above = predict_cost(6, measured, prior_slope_fraction=0.05, tolerance=0.0)
    below = predict_cost(1, measured, prior_slope_fraction=0.05, tolerance=0.0)
    assert above.optimistic_ms == pytest.approx(10.0)  # drafting deeper might be free
    assert below.optimistic_ms == pytest.approx(10.0 * 2 / 5)  # or the step might be all drafting
    assert above.point_ms == pytest.approx(11.0) and below.point_ms == pytest.approx(8.5)


def test_noise_margin_widens_the_optimism():
    measured = [(2, linear(2), linear(2) / 1.2), (4, linear(4), linear(4) / 1.2)]
    tight = predict_cost(0, arms((2, linear(2)), (4, linear(4))), prior_slope_fraction=0.05, tolerance=0.0)
    loose = predict_cost(0, measured, prior_slope_fraction=0.05, tolerance=0.0)
    assert loose.optimistic_ms < tight.optimistic_ms
    assert loose.point_ms == tight.point_ms


def test_neighbour_curve_gives_the_slope_of_a_one_arm_bucket():
    neighbour = [(gamma, 2.0 * linear(gamma)) for gamma in (0, 2, 4, 6)]  # same shape, twice the cost
    prediction = predict_from_neighbour(5, (3, linear(3), linear(3)), neighbour, slope_factor=2.0, tolerance=0.0)
    assert prediction.point_ms == pytest.approx(linear(5))
    assert linear(3) < prediction.optimistic_ms < linear(5)  # the slope may be half as steep
    down = predict_from_neighbour(1, (3, linear(3), linear(3)), neighbour, slope_factor=2.0, tolerance=0.0)
    assert down.optimistic_ms == pytest.approx(linear(3) - 2 * (linear(3) - linear(1)))  # or twice


def test_a_smaller_budget_is_never_predicted_to_cost_more_than_a_measured_larger_one():
    # The demo bench's chat@8 cell: K=4 measured at 16 ms (stale, another workload), K=5 at 12 ms.
    # The secant through them is clipped flat, which alone would price K=0 at 16 ms, above K=5,
    # and the policy would never look at the arm that was in fact the best.
    measured = arms((4, 16.0), (5, 12.0), (6, 15.5))
    for gamma in range(4):
        assert predict_cost(gamma, measured, prior_slope_fraction=0.05, tolerance=0.05).point_ms <= 12.0
