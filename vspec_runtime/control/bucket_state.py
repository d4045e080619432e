"""The bandit state of one batch-size bucket of the online policy, and its JSON summary.

Besides the arms, the state answers what only depends on it: which samples are stalls, how noisy
the arms' costs are, and what the neighbour bucket it inherited from lends it.
"""

from __future__ import annotations

import math
from collections import deque

from typing import Any

from vspec_runtime.control.base import BucketK
from vspec_runtime.control.per_request import StepCostLine
from vspec_runtime.control.window import ArmWindow


RECENT_COSTS = 32
STALL_FACTOR = 4.0  # a step slower than this many times the recent median is a stall, not a cost
ARM_STALL_FACTOR = 2.0  # the same, against the median of steps run with the same K
COST_LINE_DECAY = 0.98  # the cost line's memory: about 50 steps, short enough to follow the machine's speed
COST_LINE_MIN_VARIANCE = 0.01  # verified tokens per request must spread this much (sd 0.1) to give a slope


class BucketState(BucketK):
    """Bandit state of one batch-size bucket, on top of the K, countdown and rewards of ``BucketK``."""

    __slots__ = (
        "arms",
        "warming_up",
        "exploring",
        "neighbour",
        "samples",
        "warmup_decisions",
        "visited",
        "target",
        "challenger",
        "challenger_streak",
        "recent_costs",
        "cost_line",
        "firmed_up_at",
        "firm_up_heading",
        "regime_start",
    )

    def __init__(self, key: int, gamma: int, neighbour: BucketState | None) -> None:
        super().__init__(key, gamma)  # always a K: a new bucket starts from its neighbour's or the start K
        self.arms: dict[int, ArmWindow] = {}
        self.warming_up = True
        self.exploring = False  # moved for information, not reward: return to the best without hysteresis
        self.neighbour = neighbour  # where the priors came from (None: the first bucket)
        self.samples = 0  # stable steps ever observed (UCB's N)
        self.warmup_decisions = 0
        self.visited: set[int] = set()  # arms ever chosen in this bucket
        self.target: int | None = None  # where a switch that passed the hysteresis is heading
        self.challenger: int | None = None  # the arm preferred, within the hysteresis, lately
        self.challenger_streak = 0  # consecutive decisions it has been preferred
        # Per-request step costs of the latest stable steps, any K: the reference that tells a stall
        # (GC pause, a noisy neighbour, swapping) from a real cost. See ``without_stall``.
        self.recent_costs: deque[float] = deque(maxlen=RECENT_COSTS)
        # Cost per request against tokens verified per request, over the latest steps of any K > 0: what
        # the online policy prices arms with when ``token_costs`` is on (``OnlinePolicy._arm_costs``).
        self.cost_line = _new_cost_line()
        # ``samples`` when each arm was last firmed up: a firm-up that no cost sample of this bucket
        # followed is not repeated until one does (``OnlinePolicy._unsure_contenders``).
        self.firmed_up_at: dict[int, int] = {}
        # The thin arm a firm-up is for, while the step limit keeps it more than one move away
        # (``OnlinePolicy._firm_up_under_way``).
        self.firm_up_heading: int | None = None
        self.regime_start = 0  # ``samples`` when the costs were last forgotten: the regime's age is the rest

    @property
    def regime_age(self) -> int:
        """Stable steps measured since the bucket last forgot its costs (a new workload phase)."""
        return self.samples - self.regime_start

    def forget_costs(self) -> None:
        """Drop every arm's measurements (the workload changed); step counts and the stall reference stay."""
        self.arms.clear()
        self.cost_line = _new_cost_line()
        self.rewards = {}
        self.target = None
        self.challenger = None
        self.challenger_streak = 0
        self.exploring = False
        self.firm_up_heading = None
        self.regime_start = self.samples

    def measured(self, low: int, high: int) -> dict[int, ArmWindow]:
        return {gamma: arm for gamma, arm in self.arms.items() if low <= gamma <= high and arm.total_samples}

    def without_stall(self, interval_ms: float, batch_size: int) -> float:
        """Clip a step far slower than the bucket's recent median to STALL_FACTOR times that median.

        One stalled step (a GC pause, a noisy neighbour) would otherwise make its K look useless for
        a whole window, and a K the policy stops visiting is never measured again. Real cost
        differences between K values stay well inside the factor, so clipping never hides them.
        """
        cost = interval_ms / batch_size
        recent = self.recent_costs
        clipped = interval_ms
        if len(recent) >= 4:
            median = sorted(recent)[len(recent) // 2]
            if cost > STALL_FACTOR * median:
                clipped = STALL_FACTOR * median * batch_size
        recent.append(min(cost, clipped / batch_size))
        return clipped

    def at_bucket_batch(self, interval_ms: float, batch_size: int, fixed_ms: float | None) -> float:
        """What a step of ``batch_size`` requests would have cost, per request, had the bucket's full
        batch shared its fixed cost ``fixed_ms`` (None: unknown, the interval as it is): the interval
        less the share of the fixed cost its missing requests would have carried.

        A bucket holds several batch sizes (5-8 in the bucket of 8), and a step's fixed cost (the
        weights' pass, the scheduler) is the same whatever its size, so per request a step of 5 costs
        more than a step of 8 at any K. An arm whose window caught the steps of a draining batch then
        read dear, and one that is not visited again keeps that price: replayed on the serve bench's
        loads (eight clients started one after another, then the drain), online sat at K=1 on chat at
        batch 8 for two thirds of its steps, 4% behind K=0 (docs/benchmarks.md).
        """
        if fixed_ms is None or batch_size >= self.key:
            return interval_ms
        return interval_ms - min(fixed_ms, interval_ms) * (1.0 - batch_size / self.key)

    def clip_stalls(self) -> None:
        """Stalls recorded before the bucket had a reference median are clipped once it has one."""
        recent = self.recent_costs
        bucket_limit = STALL_FACTOR * sorted(recent)[len(recent) // 2] if len(recent) >= 4 else None
        for arm in self.arms.values():
            if arm.count >= 3:
                # Steps of one K cost about the same: a sample far above the arm's own median is a stall.
                median = arm.median_cost()
                arm.clip_costs(ARM_STALL_FACTOR * median, replacement_ms_per_request=median)
            elif bucket_limit is not None:
                arm.clip_costs(bucket_limit)

    def noise_margins(self, noise_z: float) -> dict[int, float]:
        """Per measured arm: how far its cost may plausibly lie below its mean (a fraction), at
        ``noise_z`` standard errors."""
        weighted = weights = 0.0
        counts = {gamma: arm.count for gamma, arm in self.arms.items() if arm.total_samples}
        for gamma, count in counts.items():
            variance = self.arms[gamma].relative_cost_variance()
            if variance is not None:
                weighted += variance * (count - 1)
                weights += count - 1
        # Until the bucket has seen some spread, assume 5% per step: real steps are rarely steadier.
        relative_sd = math.sqrt(weighted / weights) if weights >= 4 else 0.05
        width = noise_z * relative_sd
        return {gamma: width / math.sqrt(count) for gamma, count in counts.items()}

    def neighbour_costs(self) -> list[tuple[int, float]]:
        """The neighbour bucket's measured costs, when it has enough (two arms) to give a slope."""
        if self.neighbour is None:
            return []
        costs = sorted(
            (gamma, arm.ms_per_request_step) for gamma, arm in self.neighbour.arms.items() if arm.total_samples
        )
        return costs if len(costs) >= 2 else []

    def neighbour_priors(self, estimates: dict[int, float], low: int, high: int) -> dict[int, float]:
        """The neighbour's measured rewards, rescaled by the arms both buckets measured."""
        neighbour = self.neighbour
        if neighbour is None:
            return {}
        theirs = {gamma: arm.goodput_tokens_per_ms for gamma, arm in neighbour.arms.items() if arm.total_samples}
        shared = [gamma for gamma in estimates if theirs.get(gamma, 0.0) > 0.0]
        if not shared:
            return {}
        scale = sum(estimates[gamma] for gamma in shared) / sum(theirs[gamma] for gamma in shared)
        return {
            gamma: reward * scale
            for gamma, reward in theirs.items()
            if low <= gamma <= high and gamma not in estimates
        }


def bucket_summary(bucket: BucketState) -> dict[str, Any]:
    return {
        "gamma": bucket.gamma,
        "warming_up": bucket.warming_up,
        "decisions": bucket.decisions,
        "warmup_decisions": bucket.warmup_decisions,
        "switches": bucket.switches,
        "stable_steps": bucket.samples,
        "inherited_from": None if bucket.neighbour is None else bucket.neighbour.key,
        "cost_line": _rounded(bucket.cost_line.line()),
        "arms_visited": sorted(bucket.visited),
        "arms": {
            str(gamma): {
                "samples": arm.count,
                "goodput_tokens_per_ms": round(arm.goodput_tokens_per_ms, 6),
                "ms_per_step": round(arm.interval_ms / arm.count, 4) if arm.count else 0.0,
                "ms_per_request_step": round(arm.ms_per_request_step, 4),
                "verified_per_request_step": round(arm.verified_per_request_step, 4),
            }
            for gamma, arm in sorted(bucket.arms.items())
        },
    }


def _new_cost_line() -> StepCostLine:
    return StepCostLine(decay=COST_LINE_DECAY, min_variance=COST_LINE_MIN_VARIANCE)


def _rounded(line: tuple[float, float] | None) -> list[float] | None:
    """(fixed ms, ms per verified token), per request; None until steps verified varied counts."""
    return None if line is None else [round(value, 4) for value in line]
