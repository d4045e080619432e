"""GuardedPolicy: a policy bug must never take serving down with it.

If the wrapped policy raises in ``choose`` or ``observe`` (or returns something that is not a
Decision), the guard logs the traceback once on the ``vspec.control`` logger and from then on runs
a fixed safe K for the rest of the process (reason "fault"). It never re-raises. A K outside
[0, min(max_gamma, max_feasible_gamma)] is a policy bug too, contained the same way: the decision
is clamped (``Decision.capped``, reason "clamp"), so the scheduler can trust what it gets. The guard
wraps a policy rather than choosing K itself, so it overrides ``choose`` instead of the template.
"""

from __future__ import annotations

import logging
from typing import Any

from vspec_runtime.control.base import Decision, Policy, StepFeedback
from vspec_runtime.control.rules import feasible_cap

logger = logging.getLogger("vspec.control")


class GuardedPolicy(Policy):
    """Fault isolation and bounds around any policy."""

    def __init__(self, inner: Policy, *, safe_gamma: int, max_gamma: int) -> None:
        if max_gamma < 0 or not 0 <= safe_gamma <= max_gamma:
            raise ValueError(f"guard: need 0 <= safe_gamma ({safe_gamma}) <= max_gamma ({max_gamma})")
        self.inner = inner
        self.safe_gamma = safe_gamma
        self.max_gamma = max_gamma
        self.name = getattr(inner, "name", "policy")
        self.faulted = False
        self.fault: str | None = None  # "ExceptionType: message" of the first fault

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        cap = feasible_cap(max_feasible_gamma, self.max_gamma)
        if self.faulted:
            return self._frozen(cap)
        try:
            decision = self.inner.choose(batch_size, max_feasible_gamma)
            if not isinstance(decision, Decision) or not isinstance(decision.gamma, int):
                raise TypeError(f"{self.name}.choose returned {decision!r}, not a Decision with an int gamma")
        except Exception as exc:  # noqa: BLE001 - isolating arbitrary policy bugs is the point
            self._trip("choose", exc)
            return self._frozen(cap)
        return decision.capped(cap, "clamp")

    def observe(self, feedback: StepFeedback) -> None:
        if self.faulted:
            return
        try:
            self.inner.observe(feedback)
        except Exception as exc:  # noqa: BLE001
            self._trip("observe", exc)

    def decide_next(self, batch_size: int) -> None:
        if self.faulted:
            return
        try:
            self.inner.decide_next(batch_size)
        except Exception as exc:  # noqa: BLE001
            self._trip("decide_next", exc)

    def summary(self) -> dict[str, Any]:
        guard = {"faulted": self.faulted, "safe_gamma": self.safe_gamma, "fault": self.fault}
        try:
            inner = dict(self.inner.summary())
        except Exception as exc:  # noqa: BLE001 - a summary must not fail shutdown either
            inner = {"policy": self.name, "summary_error": f"{type(exc).__name__}: {exc}"}
        return {**inner, "guard": guard}

    def _frozen(self, cap: int) -> Decision:
        """The safe K, run from the first fault on (still within what fits in the step)."""
        return Decision(self.safe_gamma, "fault").capped(cap, "fault")

    def _trip(self, where: str, exc: Exception) -> None:
        self.faulted = True
        self.fault = f"{type(exc).__name__}: {exc}"
        logger.exception(
            "vspec policy '%s' failed in %s(); speculation frozen at K=%d for the rest of this run",
            self.name,
            where,
            self.safe_gamma,
        )
