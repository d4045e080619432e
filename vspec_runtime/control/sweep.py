"""SweepPolicy: force K through a fixed list, ``control_interval`` steps each (profiling mode).

`vspec profile collect` runs one engine with this policy so that every K in the list is measured
at every batch size in the same process: no restart per (batch, K) point. It cycles rather than
running each K once so that K is not confounded with the context length, which grows through a
run. It learns nothing; ``observe`` only counts. The guard rails are every policy's (``Policy.choose``):
a K above the feasibility cap (B*(K+1) > max_num_batched_tokens) runs at the cap, reason
"infeasible", and the sample records the K actually verified. Its ``control_interval`` is not the
rules' one: the steps between two K changes are measurements ("sweep"), not "hold" steps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from vspec_runtime.control.base import BucketK, Policy, StepFeedback, Target


class SweepPolicy(Policy):
    """K = gammas[i], i advancing every ``control_interval`` decisions, wrapping around."""

    name = "sweep"

    def __init__(self, gammas: Iterable[int], control_interval: int) -> None:
        gammas = tuple(gammas)
        if not gammas:
            raise ValueError("sweep policy: the list of K values is empty")
        for gamma in gammas:
            if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
                raise ValueError(f"sweep policy: K values must be integers >= 0, got {gamma!r}")
        if not isinstance(control_interval, int) or control_interval < 1:
            raise ValueError(f"sweep policy: control_interval must be an integer >= 1, got {control_interval!r}")
        self.gammas = gammas
        self.control_interval = control_interval
        self._decisions = 0
        self._stable_steps: Counter[int] = Counter()

    @property
    def current(self) -> int:
        """K the next decision returns (before the feasibility cap)."""
        return self.gammas[(self._decisions // self.control_interval) % len(self.gammas)]

    def _target(self, bucket: BucketK, batch_size: int, current: int | None, low: int, high: int) -> Target:
        gamma = self.current
        self._decisions += 1
        return Target(gamma, "sweep")

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.stable:
            self._stable_steps[feedback.gamma] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "gammas": list(self.gammas),
            "control_interval": self.control_interval,
            "decisions": self._decisions,
            "stable_steps": {str(k): n for k, n in sorted(self._stable_steps.items())},
        }
