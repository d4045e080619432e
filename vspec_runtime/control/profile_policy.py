"""ProfilePolicy: choose K from a measured latency model and the live acceptance rates.

Goodput G(K) = B * E[K] / (T_step(K) * correction(K)), where T_step comes from the profile (see
``latency_profile``), E[K] from the acceptance model, and correction(K) is an EWMA of measured /
predicted step time for that K in that batch-size bucket, clamped to [0.1, 10]: the profile gets
the shape right, the correction absorbs what changed since it was measured. A K never run in the
bucket borrows the correction of the nearest K that was, but never above 1: a profile found too
slow for every K is trusted as is, one found too fast for the K we run makes the untried K look
better until they are tried (optimism is the only exploration this policy does).

Guard rails: those of every policy (``Policy.choose``: decisions every ``control_interval`` steps
of a bucket, moves of at most ``max_gamma_step``, K capped by the caller's feasibility bound), and
a switch only when the best beats the current K by ``hysteresis``. Before any acceptance data
exists, the profile's batch-size table (when present) is the prior.

The profile format is defined in ``latency_profile.py``; ``LatencyProfile`` is re-exported here.
"""

from __future__ import annotations

from typing import Any

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.base import BucketK, Policy, StepFeedback, Target
from vspec_runtime.control.latency_profile import ComponentLatency, LatencyProfile
from vspec_runtime.control.rules import KRules, check_adaptive_settings, clamp_gamma
from vspec_runtime.control.window import bucket_of

__all__ = ["ComponentLatency", "LatencyProfile", "ProfilePolicy"]

_CORRECTION_RANGE = (0.1, 10.0)


class _ProfileBucket(BucketK):
    """A bucket's K (``BucketK``) plus its corrections. Its ``rewards`` stay empty: the goodputs go
    with each decision only, so "hold" decisions carry none."""

    __slots__ = ("corrections",)

    def __init__(self, key: int) -> None:
        super().__init__(key)  # gamma None: the first decision takes the model's best K at once
        self.corrections: dict[int, float] = {}  # K -> EWMA of measured / predicted step time

    def correction(self, gamma: int) -> float:
        if gamma in self.corrections:
            return self.corrections[gamma]
        if not self.corrections:
            return 1.0
        nearest = min(self.corrections, key=lambda known: (abs(known - gamma), known))
        # Optimistic: an untried K is never assumed slower than the profile says, so a profile
        # that is wrong for the K we run sends us to try the others instead of freezing in place.
        return min(1.0, self.corrections[nearest])


class ProfilePolicy(Policy):
    """K from a latency profile plus live acceptance; see the module docstring."""

    name = "profile"

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        max_gamma: int | None = None,
        min_gamma: int = 0,
        max_gamma_step: int = 2,
        control_interval: int = 4,
        hysteresis: float = 0.05,
        correction_weight: float = 0.1,
        acceptance_memory_requests: float = 32.0,
    ) -> None:
        self.profile = profile
        self.max_gamma = profile.max_gamma if max_gamma is None else min(max_gamma, profile.max_gamma)
        # A min_gamma above the profile's largest K is lowered to it, not rejected: the profile may
        # cover fewer K than the engine runs, and the factory checked min_gamma against the engine's.
        self.min_gamma = min(min_gamma, self.max_gamma)
        self.rules = KRules(self.max_gamma, self.min_gamma, max_gamma_step, control_interval)
        check_adaptive_settings("profile policy", self.rules, hysteresis)
        if not 0.0 < correction_weight <= 1.0:
            raise ValueError(f"profile policy: correction_weight must be in (0, 1], got {correction_weight}")
        self.hysteresis = hysteresis
        self.correction_weight = correction_weight
        self.acceptance = AcceptanceStats(max(1, self.max_gamma), memory_requests=acceptance_memory_requests)
        self._buckets: dict[int, _ProfileBucket] = {}
        self._context_per_request = 0.0  # EWMA; the profile's alpha term needs the batch's context

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.batch_size < 1:
            return
        drafted, accepted = feedback.acceptance_trials()
        if drafted:
            self.acceptance.update(drafted, accepted)
        if feedback.context_tokens > 0:
            per_request = feedback.context_tokens / feedback.batch_size
            self._context_per_request += 0.1 * (per_request - self._context_per_request)
        if not feedback.is_cost_sample(self.max_gamma):
            return
        predicted = self.profile.step_ms(feedback.batch_size, feedback.gamma, feedback.context_tokens)
        if predicted <= 0.0:
            return
        bucket = self._bucket(feedback.batch_size)
        ratio = min(max(feedback.interval_ms / predicted, _CORRECTION_RANGE[0]), _CORRECTION_RANGE[1])
        previous = bucket.corrections.get(feedback.gamma)
        bucket.corrections[feedback.gamma] = (
            ratio if previous is None else previous + self.correction_weight * (ratio - previous)
        )

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "profile_meta": self.profile.meta,
            "buckets": {
                str(key): {
                    "gamma": bucket.gamma,
                    "decisions": bucket.decisions,
                    "switches": bucket.switches,
                    "corrections": {str(k): round(v, 4) for k, v in sorted(bucket.corrections.items())},
                }
                for key, bucket in sorted(self._buckets.items())
            },
            "acceptance": self.acceptance.summary(),
        }

    def predicted_goodput(self, batch_size: int, gamma: int) -> float:
        """G(K) in tokens per ms for ``batch_size`` requests, with the current corrections."""
        key = bucket_of(batch_size)
        bucket = self._buckets.get(key) or _ProfileBucket(key)
        return self._goodput(bucket, batch_size, gamma, self.acceptance.expected_committed_curve())

    def _goodput(self, bucket: _ProfileBucket, batch_size: int, gamma: int, expected: list[float]) -> float:
        context = self._context_per_request * batch_size
        step_ms = self.profile.step_ms(batch_size, gamma, context) * bucket.correction(gamma)
        return batch_size * expected[gamma] / step_ms if step_ms > 0 else 0.0

    def _bucket(self, batch_size: int) -> _ProfileBucket:
        key = bucket_of(batch_size)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _ProfileBucket(key)
        return bucket

    def _target(self, bucket: _ProfileBucket, batch_size: int, current: int | None, low: int, high: int) -> Target:
        table_gamma = self.profile.table_gamma(batch_size)
        if self.acceptance.total_trials == 0 and table_gamma is not None:
            # No acceptance data yet: the profile's table is the measured prior. Its K was measured
            # for this very batch size, so it is taken at once rather than stepped toward.
            return Target(clamp_gamma(table_gamma, low, high), "prior", step_limited=False)
        expected = self.acceptance.expected_committed_curve()
        goodputs = {gamma: self._goodput(bucket, batch_size, gamma, expected) for gamma in range(low, high + 1)}
        best = max(sorted(goodputs), key=lambda gamma: goodputs[gamma])
        if current is None:
            return Target(best, "model", goodputs)
        if best != current and goodputs[best] > goodputs[current] * (1.0 + self.hysteresis):
            return Target(best, "exploit", goodputs)
        return Target(current, "hold", goodputs)
