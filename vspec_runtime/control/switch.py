"""PolicySwitch: several labelled policies in one engine, one active at a time (interleaved bench).

`vspec bench` compares policies inside one warm engine so that a fast or slow engine run cannot
favour one of them: the driver runs a round of prompts under one label, then the same prompts under
the next. Each label keeps its own policy object, and so its own learned state, across its rounds,
as a long-running server would; only the active one chooses K and sees feedback. Switching happens
between rounds, when the engine is idle (the controller calls ``select``), so no step's feedback is
credited to the wrong policy.

Pure Python like every policy: no vLLM import.
"""

from __future__ import annotations

from typing import Any

from vspec_runtime.control.base import Decision, Policy, StepFeedback


class PolicySwitch:
    """Duck-types ``Policy``: ``choose``/``observe``/``decide_next``/``summary`` go to the active labelled policy."""

    name = "switch"

    def __init__(self, policies: dict[str, Policy], active: str) -> None:
        if not policies:
            raise ValueError("policy switch: no policies")
        if active not in policies:
            raise ValueError(f"policy switch: unknown label {active!r}; have {', '.join(policies)}")
        self.policies = dict(policies)
        self.active = active
        self.switches = 0

    def select(self, label: str) -> bool:
        """Make ``label`` the active policy; False (and no change) for an unknown label."""
        if label not in self.policies:
            return False
        if label != self.active:
            self.active = label
            self.switches += 1
        return True

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        return self.policies[self.active].choose(batch_size, max_feasible_gamma)

    def observe(self, feedback: StepFeedback) -> None:
        self.policies[self.active].observe(feedback)

    def decide_next(self, batch_size: int) -> None:
        self.policies[self.active].decide_next(batch_size)

    @property
    def faulted(self) -> bool:
        return any(getattr(policy, "faulted", False) for policy in self.policies.values())

    def summary(self) -> dict[str, Any]:
        """The active policy's summary (the trace reads it every decision, so only that one)."""
        return {**self.policies[self.active].summary(), "active": self.active}

    def summaries(self) -> dict[str, Any]:
        """Every label's summary (for the shutdown summary)."""
        return {label: policy.summary() for label, policy in self.policies.items()}
