"""The contract between the scheduler (which talks to vLLM) and the policies (which do not).

Everything in ``vspec_runtime.control`` is pure Python: no vLLM, torch or numpy import, so policies
are unit-testable against a simulator and cost microseconds per decision.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Decision:
    """What a policy chose for the next step, and why (the trace records it verbatim)."""

    gamma: int
    reason: str  # short machine-readable tag: warmup, explore, exploit, hold, clamp, infeasible, ...
    bucket: int = 0
    # Reward estimate (goodput, committed tokens per ms) per candidate K in this bucket, when known.
    rewards: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepFeedback:
    """What one verified step told us. Built by the scheduler from vLLM's ModelRunnerOutput."""

    batch_size: int  # requests in the step
    gamma: int  # K the policy chose for this step (0 = no drafting)
    drafted: tuple[int, ...]  # per request: draft tokens verified this step
    accepted: tuple[int, ...]  # per request: draft tokens accepted this step
    interval_ms: float  # non-overlapping time since the previous step completed
    stable: bool  # pure decode step: nobody admitted, every request verified K+1 tokens
    context_tokens: int = 0  # total context length over the batch (for latency models)
    batched_tokens: int = 0  # tokens the target verified this step

    @property
    def committed_tokens(self) -> int:
        """Tokens that entered the outputs: accepted drafts plus one target token per request."""
        return sum(self.accepted) + self.batch_size

    def acceptance_trials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(drafted, accepted) per request, as trials of the budget K rather than of the drafts made.

        A drafter may propose fewer than K tokens, or none: n-gram lookup finds no match on most
        steps of open-ended text. What the policy must predict is what a *budget* K commits per
        request-step, so on a stable step every request counts as having had K draft positions,
        and a position it did not fill is a failure. Counting only the drafts made would say that
        n-gram on chat, whose rare multi-token matches are usually right, gains a lot from a large
        K, while each step at that K verifies more tokens for about nothing. EAGLE and draft models
        always fill K, so for them nothing changes. Unstable steps (prefills, a K switch) keep
        the drafts as made: their budget is not one K.
        """
        if not self.stable or self.gamma <= 0 or len(self.drafted) > self.batch_size:
            return self.drafted, self.accepted
        missing = self.batch_size - len(self.accepted)
        accepted = self.accepted
        if accepted and max(accepted) > self.gamma:  # rare; max() keeps a batch of 256 cheap otherwise
            accepted = tuple(min(a, self.gamma) for a in accepted)
        return (self.gamma,) * self.batch_size, tuple(accepted) + (0,) * missing


class Policy(abc.ABC):
    """A small state object choosing K. ``choose`` then ``observe``, once per scheduled step."""

    name: str = "policy"

    @abc.abstractmethod
    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        """K for a step of ``batch_size`` requests; never above ``max_feasible_gamma``."""

    @abc.abstractmethod
    def observe(self, feedback: StepFeedback) -> None:
        """Feed back the outcome of a step that ran with the K this policy chose."""

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary (logged at shutdown, shown in metrics)."""
        return {"policy": self.name}
