"""Per-position acceptance statistics, and the tokens a draft budget K is expected to commit.

For a verified request that drafted ``d`` tokens and had ``a`` accepted, positions 1..a are
successes, position a+1 is one failure when a < d, and later positions were not observed. Each
position j keeps a conditional rate p_j = P(draft j accepted | drafts 1..j-1 accepted) as an
exponentially weighted ratio of successes to trials, so

    E[K] = 1 + sum_{i=1..K} prod_{j<=i} p_j          (p = 0.5, K = 3 gives 1.875)

is the expected number of tokens a request commits per step with budget K (the accepted drafts plus
the target's own token). This is exact for any dependence between positions: it is the chain rule
applied to P(L >= i), L being the accepted run length.

Two choices beyond a plain EWMA, both about positions we have not seen lately:

* The prior of p_j is p_{j-1} (p_1's is ``prior_rate``): without evidence, a deeper position is
  assumed as good as the one before it, not reset to 0.5.
* A position that goes unobserved (the policy stopped drafting that deep) keeps the ratio it had to
  the previous position when it was last observed. When the workload changes phase while the policy
  sits at K = 1, p_1 moves and the unobserved p_2..p_K move with it, so the model can tell that a
  deeper K has become worth trying instead of trusting stale numbers from another phase. Evidence of
  unobserved positions also fades slowly (``stale_half_life_steps``) toward the chain prior, so that
  even at K = 0, where nothing is observed, the model eventually asks for a probe.

Memory is O(max_positions), whatever the run length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

_RATE_CEILING = 0.999  # keeps E[K] finite and lets one failure still move a perfect record


class AcceptanceStats:
    """Conditional acceptance rate per draft position, updated from verified steps."""

    __slots__ = (
        "max_positions",
        "prior_rate",
        "prior_weight",
        "_request_decay",
        "_step_decay",
        "_stale_decay",
        "_successes",
        "_trials",
        "_anchor",
        "_rates",
        "_expected",
        "total_trials",
        "updates",
    )

    def __init__(
        self,
        max_positions: int = 16,
        *,
        prior_rate: float = 0.5,
        prior_weight: float = 2.0,
        memory_requests: float = 32.0,
        min_memory_steps: float = 8.0,
        stale_half_life_steps: float = 256.0,
    ) -> None:
        _check_settings(max_positions, prior_rate, prior_weight, memory_requests, stale_half_life_steps)
        if not min_memory_steps >= 1.0:
            raise ValueError(f"min_memory_steps must be >= 1, got {min_memory_steps!r}")
        self.max_positions = max_positions
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        # Forgetting counts requests, not steps: a batch of 64 adapts in as many tokens as a batch
        # of 1, and the estimate always rests on about memory_requests requests.
        self._request_decay = math.exp(-1.0 / memory_requests)
        # ... but never forget faster than min_memory_steps steps, or at batch 64 the model would
        # rest on the last step alone and every decision would see a different snapshot.
        self._step_decay = math.exp(-1.0 / min_memory_steps)
        self._stale_decay = 0.5 ** (1.0 / stale_half_life_steps)
        self._successes = [0.0] * (max_positions + 1)  # index j = position j; index 0 unused
        self._trials = [0.0] * (max_positions + 1)
        # p_{j-1} as it was when position j was last observed (None: never observed).
        self._anchor: list[float | None] = [None] * (max_positions + 1)
        self._rates = [0.0] * (max_positions + 1)
        self._expected = [1.0] * (max_positions + 1)
        self.total_trials = 0.0
        self.updates = 0
        self._refresh()

    # -- feeding ---------------------------------------------------------------------------------

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Fold in one verified step: per request, tokens drafted and tokens accepted."""
        eligible_at, successes_at, failures_at = self._count_outcomes(drafted, accepted)
        for position in range(1, self.max_positions + 1):
            if eligible_at[position]:
                # Time for position j runs in requests that drafted at least j tokens, reached or
                # not: a deep position that is rarely reached still forgets an old phase as fast
                # as position 1 does, and falls back on the chain prior meanwhile.
                decay = max(self._request_decay ** eligible_at[position], self._step_decay)
            else:
                decay = self._stale_decay
            trials = successes_at[position] + failures_at[position]
            self._successes[position] = self._successes[position] * decay + successes_at[position]
            self._trials[position] = self._trials[position] * decay + trials
            self.total_trials += trials
        self.updates += 1
        self._refresh(eligible_at)

    def _count_outcomes(
        self, drafted: Sequence[int], accepted: Sequence[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """Per position: requests that drafted that deep, successes, failures. O(requests + positions)."""
        top = self.max_positions
        runs_ending_at = [0] * (top + 2)  # requests whose accepted run is exactly a (clipped to top)
        drafts_ending_at = [0] * (top + 2)
        failures_at = [0] * (top + 2)
        for drafted_tokens, accepted_tokens in zip(drafted, accepted):
            drafted_tokens = max(0, int(drafted_tokens))
            accepted_tokens = min(max(0, int(accepted_tokens)), drafted_tokens)
            runs_ending_at[min(accepted_tokens, top)] += 1
            drafts_ending_at[min(drafted_tokens, top)] += 1
            if accepted_tokens < drafted_tokens and accepted_tokens < top:
                failures_at[accepted_tokens + 1] += 1
        successes_at = [0] * (top + 2)
        eligible_at = [0] * (top + 2)
        reached = drafting = 0
        for position in range(top, 0, -1):  # "at least j" counts are suffix sums
            reached += runs_ending_at[position]
            drafting += drafts_ending_at[position]
            successes_at[position] = reached
            eligible_at[position] = drafting
        return eligible_at, successes_at, failures_at

    # -- reading ---------------------------------------------------------------------------------

    def rate(self, position: int) -> float:
        """p_j for 1-based position j (positions past the tracked range repeat the last one)."""
        if position < 1:
            raise ValueError(f"position must be >= 1, got {position}")
        return self._rates[min(position, self.max_positions)]

    def rates(self, depth: int | None = None) -> list[float]:
        """[p_1, ..., p_depth]."""
        depth = self.max_positions if depth is None else depth
        return [self.rate(position) for position in range(1, depth + 1)]

    def expected_committed(self, gamma: int) -> float:
        """E[K]: expected tokens a request commits in one step with draft budget ``gamma``."""
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if gamma <= self.max_positions:
            return self._expected[gamma]
        expected, reach = self._expected[-1], self._reach(self.max_positions)
        last_rate = self._rates[self.max_positions]
        for _ in range(gamma - self.max_positions):
            reach *= last_rate
            expected += reach
        return expected

    def expected_committed_curve(self) -> list[float]:
        """[E[0], E[1], ..., E[max_positions]] (a copy; cheap, computed at update time)."""
        return list(self._expected)

    def evidence(self, position: int) -> float:
        """Effective number of trials behind p_j (decayed)."""
        return self._trials[min(max(position, 1), self.max_positions)]

    def summary(self) -> dict[str, Any]:
        return {
            "rates": [round(rate, 4) for rate in self._rates[1:]],
            "evidence_trials": [round(trials, 1) for trials in self._trials[1:]],
            "expected_committed": [round(value, 4) for value in self._expected],
            "total_trials": round(self.total_trials, 1),
        }

    # -- internals -------------------------------------------------------------------------------

    def _reach(self, gamma: int) -> float:
        reach = 1.0
        for position in range(1, gamma + 1):
            reach *= self._rates[position]
        return reach

    def _refresh(self, eligible_at: list[int] | None = None) -> None:
        """Recompute rates and E[K] once per update, so reads are O(1)."""
        previous_rate = self.prior_rate
        reach, expected = 1.0, 1.0
        for position in range(1, self.max_positions + 1):
            evidence_successes = self._successes[position]
            anchor = self._anchor[position]
            if eligible_at is not None and eligible_at[position]:
                self._anchor[position] = previous_rate
            elif anchor is not None and anchor > 0.0:
                # Not drafted this deep lately: keep this position's last known ratio to the previous
                # one, so it follows the previous position through a phase change.
                evidence_successes *= previous_rate / anchor
            rate = (evidence_successes + self.prior_weight * previous_rate) / (
                self._trials[position] + self.prior_weight
            )
            rate = min(max(rate, 0.0), _RATE_CEILING)
            self._rates[position] = rate
            reach *= rate
            expected += reach
            self._expected[position] = expected
            previous_rate = rate


def _check_settings(max_positions, prior_rate, prior_weight, memory_requests, stale_half_life_steps) -> None:
    if not isinstance(max_positions, int) or max_positions < 1:
        raise ValueError(f"max_positions must be an int >= 1, got {max_positions!r}")
    if not 0.0 <= prior_rate <= 1.0:
        raise ValueError(f"prior_rate must be in [0, 1], got {prior_rate!r}")
    if not prior_weight > 0.0 or not math.isfinite(prior_weight):
        raise ValueError(f"prior_weight must be a positive number, got {prior_weight!r}")
    if not memory_requests >= 1.0 or not math.isfinite(memory_requests):
        raise ValueError(f"memory_requests must be >= 1, got {memory_requests!r}")
    if not stale_half_life_steps > 0.0:
        raise ValueError(f"stale_half_life_steps must be > 0, got {stale_half_life_steps!r}")
