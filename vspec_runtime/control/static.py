"""Policies that do not learn: a constant K, and vLLM's batch-size table.

They share the interface and ``Policy.choose``'s rules (K capped by feasibility, reason
"infeasible") so that the scheduler, the trace and the benchmarks treat adaptive and static runs
alike. They keep no bucket state: they decide every step, with no step limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vspec_runtime.control.base import BucketK, Policy, StepFeedback, Target
from vspec_runtime.control.latency_profile import table_lookup


class FixedPolicy(Policy):
    """Always the same K (capped by what fits in the step)."""

    name = "fixed"

    def __init__(self, gamma: int) -> None:
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
            raise ValueError(f"fixed policy: gamma must be an integer >= 0, got {gamma!r}")
        self.gamma = gamma
        self._steps = 0

    def _target(self, bucket: BucketK, batch_size: int, current: int | None, low: int, high: int) -> Target:
        return Target(self.gamma, "fixed")

    def observe(self, feedback: StepFeedback) -> None:
        self._steps += 1

    def summary(self) -> dict[str, Any]:
        return {"policy": self.name, "gamma": self.gamma, "steps": self._steps}


class TablePolicy(Policy):
    """Batch size -> K, as vLLM's num_speculative_tokens_per_batch_size.

    The entry of the largest listed batch size <= the actual batch size, or the smallest listed
    batch size's entry when the batch is below all of them.
    """

    name = "table"

    def __init__(self, table: Mapping[int, int]) -> None:
        self.table = _validated_table(table)
        self._steps = 0

    def _target(self, bucket: BucketK, batch_size: int, current: int | None, low: int, high: int) -> Target:
        return Target(table_lookup(self.table, batch_size), "table")

    def observe(self, feedback: StepFeedback) -> None:
        self._steps += 1

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "table": {str(batch): gamma for batch, gamma in sorted(self.table.items())},
            "steps": self._steps,
        }


def _validated_table(table: Mapping[int, int]) -> dict[int, int]:
    if not table:
        raise ValueError("table policy: the batch-size -> K table is empty")
    validated = {}
    for batch, gamma in table.items():
        try:
            batch_size, k = int(batch), int(gamma)
        except (TypeError, ValueError):
            raise ValueError(f"table policy: entry {batch!r} -> {gamma!r} is not integer -> integer") from None
        if batch_size < 1 or k < 0:
            raise ValueError(f"table policy: entry {batch_size} -> {k}; need batch >= 1 and K >= 0")
        validated[batch_size] = k
    return validated
