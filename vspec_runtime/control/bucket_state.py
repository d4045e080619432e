"""The bandit state of one batch-size bucket of the online policy, and its JSON summary."""

from __future__ import annotations

from collections import deque

from typing import Any

from vspec_runtime.control.window import ArmWindow


RECENT_COSTS = 32


class BucketState:
    """Bandit state of one batch-size bucket."""

    __slots__ = (
        "key",
        "gamma",
        "arms",
        "countdown",
        "warming_up",
        "exploring",
        "neighbour",
        "samples",
        "decisions",
        "switches",
        "warmup_decisions",
        "visited",
        "rewards",
        "target",
        "challenger",
        "challenger_streak",
        "recent_costs",
    )

    def __init__(self, key: int, gamma: int, neighbour: BucketState | None) -> None:
        self.key = key
        self.gamma = gamma  # the K this bucket runs (before the feasibility cap)
        self.arms: dict[int, ArmWindow] = {}
        self.countdown = 0  # steps left before the next decision
        self.warming_up = True
        self.exploring = False  # moved for information, not reward: return to the best without hysteresis
        self.neighbour = neighbour  # where the priors came from (None: the first bucket)
        self.samples = 0  # stable steps ever observed (UCB's N)
        self.decisions = 0
        self.switches = 0
        self.warmup_decisions = 0
        self.visited: set[int] = set()  # arms ever chosen in this bucket
        self.rewards: dict[int, float] = {}  # last estimates, shared by the "hold" decisions after it
        self.target: int | None = None  # where a switch that passed the hysteresis is heading
        self.challenger: int | None = None  # the arm preferred, within the hysteresis, lately
        self.challenger_streak = 0  # consecutive decisions it has been preferred
        # Per-request step costs of the latest stable steps, any K: the reference that tells a stall
        # (GC pause, a noisy neighbour, swapping) from a real cost. See OnlinePolicy.observe.
        self.recent_costs: deque[float] = deque(maxlen=RECENT_COSTS)

    def forget_costs(self) -> None:
        """Drop every arm's measurements (the workload changed); step counts and the stall reference stay."""
        self.arms.clear()
        self.rewards = {}
        self.target = None
        self.challenger = None
        self.challenger_streak = 0
        self.exploring = False

    def measured(self, low: int, high: int) -> dict[int, ArmWindow]:
        return {gamma: arm for gamma, arm in self.arms.items() if low <= gamma <= high and arm.total_samples}


def bucket_summary(bucket: BucketState) -> dict[str, Any]:
    return {
        "gamma": bucket.gamma,
        "warming_up": bucket.warming_up,
        "decisions": bucket.decisions,
        "warmup_decisions": bucket.warmup_decisions,
        "switches": bucket.switches,
        "stable_steps": bucket.samples,
        "inherited_from": None if bucket.neighbour is None else bucket.neighbour.key,
        "arms_visited": sorted(bucket.visited),
        "arms": {
            str(gamma): {
                "samples": arm.count,
                "goodput_tokens_per_ms": round(arm.goodput_tokens_per_ms, 6),
                "ms_per_step": round(arm.interval_ms / arm.count, 4) if arm.count else 0.0,
            }
            for gamma, arm in sorted(bucket.arms.items())
        },
    }
