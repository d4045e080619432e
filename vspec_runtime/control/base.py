"""The contract between the scheduler (which talks to vLLM) and the policies (which do not), and
``Policy.choose``: the one place the rules every policy shares are written.

Everything in ``vspec_runtime.control`` is pure Python: no vLLM, torch or numpy import, so policies
are unit-testable against a simulator and cost microseconds per decision.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field, replace
from typing import Any

from vspec_runtime.control.rules import KRules, clamp_gamma, feasible_cap, step_toward


@dataclass(frozen=True)
class Decision:
    """What a policy chose for the next step, and why (the trace records it verbatim)."""

    gamma: int
    reason: str  # short machine-readable tag: warmup, explore, exploit, hold, clamp, infeasible, ...
    bucket: int = 0
    # Reward estimate (goodput, committed tokens per ms) per candidate K in this bucket, when known.
    rewards: dict[int, float] = field(default_factory=dict)

    def capped(self, cap: int, reason: str) -> Decision:
        """This decision with K brought into [0, cap]; ``reason`` replaces its own only if K changed."""
        gamma = clamp_gamma(self.gamma, 0, cap)
        return self if gamma == self.gamma else replace(self, gamma=gamma, reason=reason)


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
    request_ids: tuple[str, ...] = ()  # the requests of ``drafted`` / ``accepted``, in order (if known)
    batch_ids: tuple[str, ...] = ()  # every request in the step, drafting or not (if known)
    # Requests of the step that cannot draft whatever K (a model drafter skipped them in a sticky K=0
    # cohort, control/sticky.py): their empty drafts say nothing about what a budget K commits.
    cannot_draft: tuple[str, ...] = ()

    @property
    def committed_tokens(self) -> int:
        """Tokens that entered the outputs: accepted drafts plus one target token per request."""
        return sum(self.accepted) + self.batch_size

    def is_cost_sample(self, max_gamma: int) -> bool:
        """Whether ``interval_ms`` measures what K = ``gamma`` costs: a stable decode step, at a K the
        policy runs (in [0, max_gamma]), with a usable interval (a clock glitch gives 0 or NaN)."""
        in_range = 0 <= self.gamma <= max_gamma
        return self.stable and in_range and math.isfinite(self.interval_ms) and self.interval_ms > 0.0

    def acceptance_trials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(drafted, accepted) per request, as trials of the budget K rather than of the drafts made.

        A drafter may propose fewer than K tokens, or none: n-gram lookup finds no match on most
        steps of open-ended text. What the policy must predict is what a *budget* K commits per
        request-step, so on a stable step every request counts as having had K draft positions,
        and a position it did not fill is a failure. Counting only the drafts made would say that
        n-gram on chat, whose rare multi-token matches are usually right, gains a lot from a large
        K, while each step at that K verifies more tokens for about nothing. EAGLE and draft models
        always fill K, so for them nothing changes. Unstable steps (prefills, a K switch) keep
        the drafts as made: their budget is not one K. Requests that ``cannot_draft`` had no budget.
        """
        able = self.batch_size - len(self.cannot_draft)
        if not self.stable or self.gamma <= 0 or len(self.drafted) > able:
            return self.drafted, self.accepted
        missing = able - len(self.accepted)
        accepted = self.accepted
        if accepted and max(accepted) > self.gamma:  # rare; max() keeps a batch of 256 cheap otherwise
            accepted = tuple(min(a, self.gamma) for a in accepted)
        return (self.gamma,) * able, tuple(accepted) + (0,) * missing

    def able_requests(self) -> tuple[str, ...]:
        """The requests of the step that can draft. Those that cannot (a sticky K=0 cohort skipped
        their drafter) commit one token whatever K: counted, they would make K>0 look worthless for
        as long as they run, and a re-probe under continuous load finds the whole batch so."""
        if not self.cannot_draft:
            return self.batch_ids
        cannot = set(self.cannot_draft)
        return tuple(request for request in self.batch_ids if request not in cannot)

    def trials_by_request(self) -> list[tuple[str, int, int]]:
        """(request, drafted, accepted) for every ``able_requests`` entry, counted as
        ``acceptance_trials`` counts them: on a stable step each had K positions (one without a
        draft accepted none); otherwise the drafts as made, (0, 0) for a request without. Empty
        when the step does not name its requests."""
        able = self.able_requests()
        if self.stable and self.gamma > 0:
            accepted_by = dict(zip(self.request_ids, self.accepted))
            return [(request, self.gamma, min(accepted_by.get(request, 0), self.gamma)) for request in able]
        made = dict(zip(self.request_ids, zip(self.drafted, self.accepted)))
        return [(request, *made.get(request, (0, 0))) for request in able]


@dataclass(frozen=True)
class Target:
    """What a policy wants its bucket to run; ``Policy.choose`` turns it into a Decision."""

    gamma: int
    reason: str
    rewards: dict[int, float] = field(default_factory=dict)
    step_limited: bool = True  # False: move there at once, past ``max_gamma_step``


class BucketK:
    """What the shared rules remember of one batch-size bucket: the K it runs and when it decides next."""

    __slots__ = ("key", "gamma", "countdown", "decisions", "switches", "rewards")

    def __init__(self, key: int, gamma: int | None = None) -> None:
        self.key = key
        self.gamma = gamma  # the K this bucket runs, before the feasibility cap; None: nothing decided yet
        self.countdown = 0  # steps left before the next decision
        self.decisions = 0
        self.switches = 0
        self.rewards: dict[int, float] = {}  # what the "hold" decisions report until the next decision


class Policy(abc.ABC):
    """A small state object choosing K. ``choose`` then ``observe``, once per scheduled step.

    ``choose`` is a template: it owns the rules every policy shares (one state per batch-size bucket,
    a decision every ``rules.control_interval`` steps of that bucket and "hold" in between, K kept
    in [min_gamma, min(max_gamma, feasibility cap)], moves of at most ``rules.max_gamma_step``, and
    reason "infeasible" when the cap lowered K). A policy sets ``rules`` and implements ``_target``,
    the K it wants; ``_bucket`` and ``_record`` are there for policies that keep more per bucket.
    """

    name: str = "policy"
    rules: KRules = KRules()

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        """K for a step of ``batch_size`` requests; never above ``max_feasible_gamma``."""
        batch_size = max(1, int(batch_size))
        bucket = self._bucket(batch_size)
        cap = feasible_cap(max_feasible_gamma, self.rules.max_gamma)
        if bucket.countdown > 0 and bucket.gamma is not None:
            bucket.countdown -= 1
            return Decision(bucket.gamma, "hold", bucket.key, bucket.rewards).capped(cap, "infeasible")
        bucket.countdown = self.rules.control_interval - 1
        low = min(self.rules.min_gamma, cap)
        current = None if bucket.gamma is None else clamp_gamma(bucket.gamma, low, cap)
        target = self._target(bucket, batch_size, current, low, cap)
        gamma = target.gamma
        if current is not None and target.step_limited:
            gamma = step_toward(current, target.gamma, self.rules.max_gamma_step)
        self._record(bucket, gamma, target.reason)
        return Decision(gamma, target.reason, bucket.key, target.rewards).capped(cap, "infeasible")

    @abc.abstractmethod
    def observe(self, feedback: StepFeedback) -> None:
        """Feed back the outcome of a step that ran with the K this policy chose."""

    def decide_next(self, batch_size: int) -> None:
        """Make the next ``choose`` for ``batch_size`` a decision, not a "hold".

        For a caller that held K without asking (the sticky K=0 cohort): the bucket's countdown is
        where the last decision left it, and a re-probe that lands on a "hold" would keep K=0 with
        nobody having looked. Policies without buckets decide every step anyway."""
        self._bucket(max(1, int(batch_size))).countdown = 0

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary (logged at shutdown, shown in metrics)."""
        return {"policy": self.name}

    def _target(self, bucket: BucketK, batch_size: int, current: int | None, low: int, high: int) -> Target:
        """The K this policy wants for ``bucket`` now, in [low, high].

        ``current`` is the K the bucket runs, brought into [low, high]; None before its first decision.
        Not abstract, so that a wrapper (the guard) can override ``choose`` instead.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither choose nor _target")

    def _bucket(self, batch_size: int) -> BucketK:
        """The state kept for ``batch_size``. By default none: a fresh bucket 0 per step, which is all a
        policy needs when it decides every step without a step limit."""
        return BucketK(0)

    def _record(self, bucket: BucketK, gamma: int, reason: str) -> None:
        """Bookkeeping of a decision (not of a hold): ``gamma`` is what the bucket runs from now on."""
        bucket.decisions += 1
        if bucket.gamma is not None and gamma != bucket.gamma:
            bucket.switches += 1
        bucket.gamma = gamma
