"""OnlinePolicy: a bandit over K per batch-size bucket, with model-guided exploration.

Reward of a step is goodput: committed tokens / the non-overlapping step interval (tokens per ms).
Only stable decode steps count toward rewards; every verified step feeds the acceptance model.
Arms are K in [min_gamma, max_gamma], kept per bucket (next power of two of the batch size), each
with a sliding window of its last ``window`` stable steps.

Two ways to estimate an arm (``model_guided``):

* off (the reference design): the arm's own ratio of sums, tokens / ms over its window. Warm-up visits
  every arm once, then goes to the best measured.
* on (default): goodput(K) = E[K] * requests / ms, with E[K] from the acceptance model shared by all
  arms and buckets, and requests / ms (the arm's cost) from the arm's own window. Why: E[K] pools
  every verified step, so it is far less noisy than one arm's token count at small batch, and it
  follows a workload phase change as soon as the acceptance rates move, where the windows of arms
  we are not on would keep stale samples. The cost part is what the hardware says and only the
  arm's own window knows it. An arm not yet measured gets a *predicted* cost from measured arms
  (``prediction.predict_cost``): reward(t) = reward(a) * (E[t]/E[a]) / cost_ratio(t, a). Warm-up
  then visits only arms whose optimistic prediction beats the best measured arm, so it does not walk
  through every K when acceptance is obviously high or obviously useless.

Guard rails around both: decisions only every ``control_interval`` steps of a bucket ("hold" in
between), moves of at most ``max_gamma_step`` per decision, a switch between measured arms only when
the best UCB score beats the current one by ``hysteresis`` (relative), and K capped by the caller's
``max_feasible_gamma`` ("infeasible" when that changes the choice). UCB score = mean + c * R_max *
sqrt(2 ln(N+1) / n), N the bucket's stable steps, n the arm's window count, R_max the best mean.

Buckets: each bucket keeps its own current K, so the clamp applies between two decisions of the same
bucket and a batch that alternates between two sizes gets each size's K at once. A new bucket starts
at the K of its nearest populated neighbour (a draining tail does not restart from max_gamma). With
model guidance the acceptance model is shared anyway, so a new bucket only needs cost measurements;
without it, the neighbour's measured rewards, rescaled to the new bucket, serve as priors and
warm-up becomes a local hill climb instead of a full sweep.

Memory: buckets x arms x window samples, whatever the run length.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.base import Decision, Policy, StepFeedback
from vspec_runtime.control.prediction import predict_cost
from vspec_runtime.control.window import ArmWindow, bucket_of

if TYPE_CHECKING:
    from vspec_runtime.spec import AdaptiveSettings


@dataclass(frozen=True)
class OnlineConfig:
    """Settings of one OnlinePolicy; validated on construction, never mutated."""

    max_gamma: int
    min_gamma: int = 0
    max_gamma_step: int = 2
    control_interval: int = 4
    hysteresis: float = 0.05
    window: int = 32
    exploration: float = 0.01  # UCB c
    model_guided: bool = True
    seed: int = 0  # breaks exact ties between candidate arms
    start_gamma: int | None = None  # K of the very first bucket; default max_gamma (vLLM's own choice)
    # Model guidance: an unmeasured arm is explored when its optimistic prediction beats the best
    # measured arm by explore_margin; secant predictions are trusted to within prediction_tolerance.
    prediction_tolerance: float = 0.05
    explore_margin: float = 0.01
    prior_slope_fraction: float = 0.05  # cost per draft token / step cost, with one arm measured
    acceptance_memory_requests: float = 32.0  # horizon of the acceptance model, in drafting requests

    def __post_init__(self) -> None:
        for problem in _config_problems(self):
            raise ValueError(f"online policy: {problem}")

    @classmethod
    def from_settings(cls, adaptive: AdaptiveSettings, max_gamma: int) -> OnlineConfig:
        return cls(
            max_gamma=max_gamma,
            min_gamma=min(adaptive.min_gamma, max_gamma),
            max_gamma_step=adaptive.max_gamma_step,
            control_interval=adaptive.control_interval,
            hysteresis=adaptive.hysteresis,
            window=adaptive.online_window,
            exploration=adaptive.online_exploration,
            model_guided=adaptive.model_guided,
            seed=adaptive.seed,
        )


def _config_problems(config: OnlineConfig):
    if not 0 <= config.max_gamma <= 64:
        yield f"max_gamma must be in [0, 64], got {config.max_gamma}"
    if not 0 <= config.min_gamma <= config.max_gamma:
        yield f"min_gamma must be in [0, max_gamma={config.max_gamma}], got {config.min_gamma}"
    if config.max_gamma_step < 1:
        yield f"max_gamma_step must be >= 1, got {config.max_gamma_step}"
    if config.control_interval < 1:
        yield f"control_interval must be >= 1, got {config.control_interval}"
    if config.window < 1:
        yield f"window must be >= 1, got {config.window}"
    for name in ("hysteresis", "exploration", "prediction_tolerance", "explore_margin", "prior_slope_fraction"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0.0):
            yield f"{name} must be a finite number >= 0, got {value}"
    if not config.acceptance_memory_requests >= 1.0:
        yield f"acceptance_memory_requests must be >= 1, got {config.acceptance_memory_requests}"
    if config.start_gamma is not None and not config.min_gamma <= config.start_gamma <= config.max_gamma:
        yield f"start_gamma must be in [min_gamma, max_gamma], got {config.start_gamma}"


class _Bucket:
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
    )

    def __init__(self, key: int, gamma: int, neighbour: _Bucket | None) -> None:
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

    def measured(self, low: int, high: int) -> dict[int, ArmWindow]:
        return {gamma: arm for gamma, arm in self.arms.items() if low <= gamma <= high and arm.count}


class OnlinePolicy(Policy):
    """Chooses K per step by a bandit over measured goodput; see the module docstring."""

    name = "online"

    def __init__(self, config: OnlineConfig | None = None, **settings: Any) -> None:
        if config is None:
            config = OnlineConfig(**settings)
        elif settings:
            config = replace(config, **settings)
        self.config = config
        self.acceptance = AcceptanceStats(
            max(1, config.max_gamma), memory_requests=config.acceptance_memory_requests
        )
        self._buckets: dict[int, _Bucket] = {}
        self._rng = random.Random(config.seed)
        self._steps = 0

    # -- the Policy interface --------------------------------------------------------------------

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        bucket = self._bucket_for(max(1, int(batch_size)))
        cap = max(0, min(self.config.max_gamma, int(max_feasible_gamma)))
        if bucket.countdown > 0:
            bucket.countdown -= 1
            return self._capped(bucket, bucket.gamma, "hold", cap)
        bucket.countdown = self.config.control_interval - 1
        gamma, reason = self._decide(bucket, cap)
        bucket.decisions += 1
        if reason == "warmup":
            bucket.warmup_decisions += 1
        if gamma != bucket.gamma:
            bucket.switches += 1
        bucket.gamma = gamma
        return self._capped(bucket, gamma, reason, cap)

    def observe(self, feedback: StepFeedback) -> None:
        self._steps += 1
        if feedback.batch_size < 1:
            return
        if feedback.drafted:
            self.acceptance.update(feedback.drafted, feedback.accepted)
        if not feedback.stable or not 0 <= feedback.gamma <= self.config.max_gamma:
            return
        if not (math.isfinite(feedback.interval_ms) and feedback.interval_ms > 0.0):
            return
        bucket = self._bucket_for(feedback.batch_size)
        arm = bucket.arms.get(feedback.gamma)
        if arm is None:
            arm = bucket.arms[feedback.gamma] = ArmWindow(self.config.window)
        arm.add(feedback.batch_size, feedback.interval_ms, feedback.committed_tokens, self._steps)
        bucket.samples += 1

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model_guided": self.config.model_guided,
            "steps": self._steps,
            "buckets": {str(key): _bucket_summary(bucket) for key, bucket in sorted(self._buckets.items())},
            "acceptance": self.acceptance.summary(),
        }

    # -- introspection (tests, benchmarks, docs) -------------------------------------------------

    def bucket_state(self, batch_size: int) -> dict[str, Any] | None:
        bucket = self._buckets.get(bucket_of(batch_size))
        return None if bucket is None else _bucket_summary(bucket)

    # -- buckets ---------------------------------------------------------------------------------

    def _bucket_for(self, batch_size: int) -> _Bucket:
        key = bucket_of(batch_size)
        bucket = self._buckets.get(key)
        if bucket is None:
            neighbour = self._nearest_populated(key)
            if neighbour is not None:
                start = neighbour.gamma
            elif self.config.start_gamma is not None:
                start = self.config.start_gamma
            else:
                start = self.config.max_gamma
            bucket = self._buckets[key] = _Bucket(key, start, neighbour)
        return bucket

    def _nearest_populated(self, key: int) -> _Bucket | None:
        """The populated bucket closest in log2(batch); on a tie the larger (a draining batch)."""
        populated = [bucket for bucket in self._buckets.values() if bucket.samples]
        if not populated:
            return None
        distance = lambda bucket: (abs(bucket.key.bit_length() - key.bit_length()), -bucket.key)  # noqa: E731
        return min(populated, key=distance)

    # -- deciding --------------------------------------------------------------------------------

    def _capped(self, bucket: _Bucket, gamma: int, reason: str, cap: int) -> Decision:
        if gamma > cap:
            return Decision(cap, "infeasible", bucket.key, bucket.rewards)
        return Decision(gamma, reason, bucket.key, bucket.rewards)

    def _decide(self, bucket: _Bucket, cap: int) -> tuple[int, str]:
        high = cap
        low = min(self.config.min_gamma, high)
        current = min(max(bucket.gamma, low), high)
        bucket.visited.add(current)
        measured = bucket.measured(low, high)
        if current not in measured:
            # Nothing to compare yet: measure the arm we are on first.
            first_reason = "prior" if bucket.neighbour is not None and not bucket.samples else "warmup"
            return current, first_reason if bucket.warming_up else "hold"
        if self.config.model_guided:
            target, reason = self._guided_target(bucket, measured, current, low, high)
        else:
            target, reason = self._plain_target(bucket, measured, current, low, high)
        gamma = self._step_toward(current, target)
        bucket.visited.add(gamma)
        return gamma, reason

    def _step_toward(self, current: int, target: int) -> int:
        step = max(-self.config.max_gamma_step, min(self.config.max_gamma_step, target - current))
        return current + step

    def _guided_target(
        self, bucket: _Bucket, measured: dict[int, ArmWindow], current: int, low: int, high: int
    ) -> tuple[int, str]:
        expected = self.acceptance.expected_committed_curve()
        estimates = {gamma: expected[gamma] / arm.ms_per_request_step for gamma, arm in measured.items()}
        best_measured = self._argmax(estimates, current)
        predicted = self._predict_unmeasured(bucket, expected, low, high)
        bucket.rewards = {**estimates, **{gamma: point for gamma, (point, _) in predicted.items()}}
        candidates = {
            gamma: optimistic
            for gamma, (_, optimistic) in predicted.items()
            if optimistic > estimates[best_measured] * (1.0 + self.config.explore_margin)
        }
        if candidates:
            bucket.exploring = True
            return self._argmax(candidates, current), "warmup" if bucket.warming_up else "explore"
        return self._exploit(bucket, measured, estimates, current)

    def _predict_unmeasured(
        self, bucket: _Bucket, expected: list[float], low: int, high: int
    ) -> dict[int, tuple[float, float]]:
        """Point and optimistic predicted goodput of every unmeasured arm in [low, high]."""
        costs = sorted((gamma, arm.ms_per_request_step) for gamma, arm in bucket.arms.items() if arm.count)
        predictions: dict[int, tuple[float, float]] = {}
        for gamma in range(low, high + 1):
            arm = bucket.arms.get(gamma)
            if arm is not None and arm.count:
                continue
            cost = predict_cost(
                gamma,
                costs,
                prior_slope_fraction=self.config.prior_slope_fraction,
                tolerance=self.config.prediction_tolerance,
            )
            predictions[gamma] = (expected[gamma] / cost.point_ms, expected[gamma] / cost.optimistic_ms)
        return predictions

    def _plain_target(
        self, bucket: _Bucket, measured: dict[int, ArmWindow], current: int, low: int, high: int
    ) -> tuple[int, str]:
        estimates = {gamma: arm.goodput_tokens_per_ms for gamma, arm in measured.items()}
        priors = self._neighbour_priors(bucket, estimates, low, high)
        bucket.rewards = {**priors, **estimates}
        if bucket.warming_up:
            target = self._plain_warmup_target(bucket, estimates, priors, current, low, high)
            if target is not None:
                bucket.exploring = True
                return target, "warmup"
        return self._exploit(bucket, measured, estimates, current)

    def _plain_warmup_target(
        self,
        bucket: _Bucket,
        estimates: dict[int, float],
        priors: dict[int, float],
        current: int,
        low: int,
        high: int,
    ) -> int | None:
        unmeasured = [gamma for gamma in range(low, high + 1) if gamma not in estimates]
        if bucket.neighbour is None:
            # The first bucket knows nothing: visit every arm, nearest first.
            return min(unmeasured, key=lambda gamma: (abs(gamma - current), gamma)) if unmeasured else None
        # An inherited bucket hill-climbs: check the arm the priors favour and the unmeasured
        # neighbours of the best arm, until the best is surrounded by measurements.
        everything = {**priors, **estimates}
        best = self._argmax(everything, current)
        if best not in estimates:
            return best
        frontier = [gamma for gamma in (best - 1, best + 1) if gamma in unmeasured]
        return min(frontier, key=lambda gamma: (abs(gamma - current), gamma)) if frontier else None

    def _neighbour_priors(
        self, bucket: _Bucket, estimates: dict[int, float], low: int, high: int
    ) -> dict[int, float]:
        """The neighbour's measured rewards, rescaled by the arms both buckets measured."""
        neighbour = bucket.neighbour
        if neighbour is None:
            return {}
        theirs = {gamma: arm.goodput_tokens_per_ms for gamma, arm in neighbour.arms.items() if arm.count}
        shared = [gamma for gamma in estimates if theirs.get(gamma, 0.0) > 0.0]
        if not shared:
            return {}
        scale = sum(estimates[gamma] for gamma in shared) / sum(theirs[gamma] for gamma in shared)
        return {
            gamma: reward * scale
            for gamma, reward in theirs.items()
            if low <= gamma <= high and gamma not in estimates
        }

    def _exploit(
        self, bucket: _Bucket, measured: dict[int, ArmWindow], estimates: dict[int, float], current: int
    ) -> tuple[int, str]:
        if bucket.warming_up or bucket.exploring:
            # Moves made for information are undone without hysteresis: go to the best measured.
            bucket.warming_up = False
            bucket.exploring = False
            bucket.target = self._argmax(estimates, current)
            return bucket.target, "exploit"
        scores = self._ucb_scores(bucket, measured, estimates)
        best = self._argmax(scores, current)
        if best == current:
            bucket.target = None
            return current, "hold"
        # The hysteresis gates the start of a switch; once a clamped move is under way it goes on
        # while its target stays the best, or it would stop on an intermediate arm just inside the
        # hysteresis band.
        if best == bucket.target or scores[best] > scores[current] * (1.0 + self.config.hysteresis):
            bucket.target = best
            return best, "exploit"
        bucket.target = None
        return current, "hold"

    def _ucb_scores(
        self, bucket: _Bucket, measured: dict[int, ArmWindow], estimates: dict[int, float]
    ) -> dict[int, float]:
        reward_scale = max(estimates.values())
        log_term = 2.0 * math.log(bucket.samples + 1)
        bonus = self.config.exploration * reward_scale
        return {
            gamma: estimates[gamma] + bonus * math.sqrt(log_term / measured[gamma].count) for gamma in estimates
        }

    def _argmax(self, values: dict[int, float], current: int) -> int:
        """Highest value; ties go to the arm nearest the current one, then to a seeded coin."""
        top = max(values.values())
        tied = [gamma for gamma, value in values.items() if value >= top]
        if len(tied) == 1:
            return tied[0]
        nearest = min(abs(gamma - current) for gamma in tied)
        tied = sorted(gamma for gamma in tied if abs(gamma - current) == nearest)
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)


def _bucket_summary(bucket: _Bucket) -> dict[str, Any]:
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
