"""Predicting the step cost of an arm we have not measured, from the arms we have.

Step cost grows roughly linearly in K: K draft forwards plus a target forward on B*(K+1) tokens.
Where it is not linear it is convex (verification turns compute-bound past a token count). The point
prediction is the secant through the nearest measured arms. The optimistic prediction, which decides
whether an arm is worth visiting, is the lowest cost a non-decreasing convex curve through the
measured arms allows: outside them the extended end segment, inside a gap the extension of the
segments on either side (a knee hides in a gap, where the secant would overestimate the cost).

With a single measured arm the slope is unknown. The point prediction then uses a prior slope, and
the optimistic one takes the most favourable plausible slope: zero above the arm (drafting is free),
and "the whole step scales with K+1" below it (drafting is everything). An arm is skipped only when
even the optimistic prediction cannot beat the best measured arm.

Costs here are milliseconds per request per step (see ``ArmWindow.ms_per_request_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

_FLOOR_FRACTION = 0.05  # a prediction never drops below 5% of the nearest measured cost


@dataclass(frozen=True)
class CostPrediction:
    point_ms: float  # best guess of ms per request-step
    optimistic_ms: float  # lowest plausible ms per request-step (gives the highest plausible goodput)


def predict_cost(
    gamma: int,
    measured: list[tuple[int, float, float]],
    *,
    prior_slope_fraction: float,
    tolerance: float,
) -> CostPrediction:
    """Cost of arm ``gamma`` from ``measured`` = [(K, ms per request-step, lowest plausible ms), ...].

    ``measured`` is sorted by K and not empty; the third field is the arm's cost less its noise
    margin, so that one unlucky sample cannot make every arm beyond it look hopeless.
    """
    points = [(gamma_, cost) for gamma_, cost, _ in measured]
    if len(measured) == 1:
        arm_gamma, arm_cost, arm_lowest = measured[0]
        point = _from_one_arm(gamma, arm_gamma, arm_cost, prior_slope_fraction).point_ms
        return CostPrediction(point, _from_one_arm(gamma, arm_gamma, arm_lowest, prior_slope_fraction).optimistic_ms)
    (near_gamma, near_cost), (far_gamma, far_cost) = _secant_pair(gamma, points)
    point = max(near_cost + _slope((near_gamma, near_cost), (far_gamma, far_cost)) * (gamma - near_gamma),
                _FLOOR_FRACTION * near_cost)
    # A smaller budget never costs more: no arm above gamma may be cheaper than its prediction. The
    # secant alone breaks this when the arms disagree (noise, or one measured under other load): with
    # K=4 at 16 ms and K=5 at 12 ms, it would predict 16 ms for K=0 and never look there.
    point = min([point] + [cost for gamma_, cost in points if gamma_ > gamma])
    lowest_points = [(gamma_, lowest) for gamma_, _, lowest in measured]
    lowest = max(_convex_lower_bound(gamma, lowest_points), _FLOOR_FRACTION * near_cost)
    return CostPrediction(point, min(point, lowest) / (1.0 + tolerance))


def predict_from_neighbour(
    gamma: int,
    arm: tuple[int, float, float],
    neighbour: list[tuple[int, float]],
    *,
    slope_factor: float,
    tolerance: float,
) -> CostPrediction:
    """Cost of arm ``gamma`` in a bucket that measured one arm, from a neighbour bucket's cost curve.

    ``arm`` is (K, ms per request-step, lowest plausible ms) of the one measured arm; ``neighbour``
    is the neighbour bucket's [(K, ms per request-step), ...] (two or more, sorted). The neighbour's
    curve, scaled to agree at ``arm``, is the point prediction. Its slope is trusted to within a
    factor ``slope_factor`` (2 per power of two between the buckets: per request, the per-forward
    part of a draft's cost scales with 1/B), which bounds the optimistic prediction.
    """
    arm_gamma, arm_cost, arm_lowest = arm
    theirs_at_arm = _curve_at(arm_gamma, neighbour)
    scale = arm_cost / theirs_at_arm if theirs_at_arm > 0 else 1.0
    floor = _FLOOR_FRACTION * arm_cost
    rise = (_curve_at(gamma, neighbour) - theirs_at_arm) * scale
    point = max(arm_cost + rise, floor)
    if gamma > arm_gamma:
        lowest = arm_lowest + max(0.0, rise) / slope_factor
    else:
        lowest = arm_lowest + min(0.0, rise) * slope_factor
    return CostPrediction(point, min(point, max(lowest, floor)) / (1.0 + tolerance))


def _curve_at(gamma: int, points: list[tuple[int, float]]) -> float:
    """The measured cost at ``gamma``, or the secant through the nearest measured arms."""
    for point_gamma, cost in points:
        if point_gamma == gamma:
            return cost
    (near_gamma, near_cost), (far_gamma, far_cost) = _secant_pair(gamma, points)
    return max(near_cost + _slope((near_gamma, near_cost), (far_gamma, far_cost)) * (gamma - near_gamma),
               _FLOOR_FRACTION * near_cost)


def _slope(first: tuple[int, float], second: tuple[int, float]) -> float:
    # Cost cannot fall as K grows; a negative slope is measurement noise.
    return max(0.0, (second[1] - first[1]) / (second[0] - first[0]))


def _convex_lower_bound(gamma: int, measured: list[tuple[int, float]]) -> float:
    """The lowest cost at ``gamma`` consistent with a non-decreasing convex cost through ``measured``.

    Outside the measured range that is the extended end segment. Inside, the arm's neighbouring
    segments bound it: the slope left of the gap can only grow, the slope right of it only shrink
    going back. A knee (verification turning compute-bound) hides inside a gap exactly this way, so
    the bound, not the secant, decides whether the arm is worth a look.
    """
    below = [arm for arm in measured if arm[0] < gamma]
    above = [arm for arm in measured if arm[0] > gamma]
    if not above:
        return below[-1][1] + _slope(below[-2], below[-1]) * (gamma - below[-1][0])
    from_right = above[0][1] - _slope(above[0], above[1]) * (above[0][0] - gamma) if len(above) > 1 else 0.0
    if not below:
        return from_right
    left_slope = _slope(below[-2], below[-1]) if len(below) > 1 else 0.0
    from_left = below[-1][1] + left_slope * (gamma - below[-1][0])
    return max(from_left, from_right)


def _from_one_arm(gamma: int, arm_gamma: int, arm_cost: float, prior_slope_fraction: float) -> CostPrediction:
    floor = _FLOOR_FRACTION * arm_cost
    point = max(arm_cost * (1.0 + prior_slope_fraction * (gamma - arm_gamma)), floor)
    if gamma > arm_gamma:
        optimistic = arm_cost  # drafting deeper might cost nothing
    else:
        optimistic = max(arm_cost * (gamma + 1) / (arm_gamma + 1), floor)  # the step might be all drafting
    return CostPrediction(point, min(point, optimistic))


def _secant_pair(gamma: int, measured: list[tuple[int, float]]) -> tuple[tuple[int, float], tuple[int, float]]:
    """The two measured arms to draw the secant through, nearest to ``gamma`` first."""
    below = [arm for arm in measured if arm[0] < gamma]
    above = [arm for arm in measured if arm[0] > gamma]
    if below and above:
        nearest_below, nearest_above = below[-1], above[0]
        if gamma - nearest_below[0] <= nearest_above[0] - gamma:
            return nearest_below, nearest_above
        return nearest_above, nearest_below
    if below:
        return below[-1], below[-2]
    return above[0], above[1]
