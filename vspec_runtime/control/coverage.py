"""How much fewer steps a larger K spends inside accepting runs: the factor E[K] per step must take.

The acceptance models (``acceptance.py``, ``batch_acceptance.py``) say what a budget K commits at
the steps the policy ran. Which steps those are depends on K. Text comes in stretches the drafter
gets right (a line the answer repeats from the prompt) and stretches it does not, and a small K
spends many steps crossing a right stretch where a large K spends one. So the steps the policy
observes at a small K start inside right stretches more often than a large K's steps would, and
their mean, extrapolated to the large K, flatters it. Measured on the demo's code prompts at batch 8
(docs/benchmarks.md, "The demo replayed"): read from the steps the online policy ran (mostly K=1-3),
E[6] was 2.3-2.6 where fixed K=6 commits 1.80, so K=6 looked near-tied with the best (K=1) and was
explored and firmed up for half the cell; online ran 0.92x the best fixed K there.

This tally reads the same steps per token instead: for each step a request verified with budget K'
(``StepFeedback.acceptance_trials``) that committed c = 1 + a tokens (a drafts accepted), what would
covering those c tokens have taken at budget K?

* the run ended inside the step (a < K'): ceil(c / (K + 1)) steps, each taking K drafts and the
  target's token until the rejected draft (exact for a drafter that continues the same run, n-gram
  lookup; a model drafter re-drafts and does about as well);
* the whole budget was accepted (a = K') and K <= K': c / (K + 1) steps, the run goes on past the step;
* a = K' and K > K': c / (c + x) steps, x the tokens the longer budget is expected to accept past K'
  (from the pooled position rates: the run is known to reach K' + 1 only).

Then E_cover[K] = (sum of c) / (sum of steps at K): tokens per step over the text the steps covered,
which is what fixed K would commit on it. Beside it the plain mean over the same steps,
E_step[K] = mean(1 + min(a, K)) (extrapolated the same way), and ``compression()`` returns
E_cover[K] / E_step[K] (1 at K=0; below 1 where runs make K's steps fewer, about 1 where
acceptance has no memory, as for a model drafter on uniform text). The online policy multiplies the
curve it reads (the batch's own or the pooled one) by it: the batch model keeps telling which
requests run now, this factor how K cuts their text into steps. The run model
(``run_acceptance.py``) answers the same question by numbering positions along runs; this one keeps
the step model's positions and weights its steps instead.

Memory: two curves of max_gamma + 1 sums, forgotten per request-step over ``memory_requests`` (the
steady horizon of the pooled model) and cleared when the pooled model sees a new phase. Work per step:
distinct (drafted, accepted) pairs x (max_gamma + 1), plus max_gamma per fully accepted pair.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = ["CoverageTally"]


class CoverageTally:
    """Per K: tokens per step over the text recent steps covered, against their plain per-step mean."""

    __slots__ = ("max_gamma", "_decay", "_tokens", "_requests", "_steps_at", "_committed_at")

    def __init__(self, max_gamma: int, *, memory_requests: float = 256.0) -> None:
        if max_gamma < 0:
            raise ValueError(f"max_gamma must be >= 0, got {max_gamma}")
        if not (math.isfinite(memory_requests) and memory_requests >= 1.0):
            raise ValueError(f"memory_requests must be >= 1, got {memory_requests!r}")
        self.max_gamma = max_gamma
        self._decay = math.exp(-1.0 / memory_requests)
        self.clear()

    def clear(self) -> None:
        """Forget everything (the workload changed phase)."""
        self._tokens = 0.0  # committed tokens of the steps tallied
        self._requests = 0.0  # request-steps tallied
        self._steps_at = [0.0] * (self.max_gamma + 1)  # steps K would have taken over those tokens
        self._committed_at = [0.0] * (self.max_gamma + 1)  # tokens K would have committed at those steps

    def update(self, budget: int, accepted: Sequence[int], rates: Sequence[float]) -> None:
        """Fold in one stable step: ``budget`` K' every request had, ``accepted`` drafts per request
        (budget trials: an empty draft accepted 0), ``rates`` the pooled p_1, p_2, ... for the tail."""
        if budget <= 0 or not accepted:
            return
        requests = len(accepted)
        fade = self._decay**requests
        self._tokens *= fade
        self._requests *= fade
        steps_at, committed_at = self._steps_at, self._committed_at
        for gamma in range(self.max_gamma + 1):
            steps_at[gamma] *= fade
            committed_at[gamma] *= fade
        for accepted_tokens, count in Counter(accepted).items():
            accepted_tokens = min(max(int(accepted_tokens), 0), budget)
            self._add(budget, accepted_tokens, count, rates)
            self._tokens += count * (accepted_tokens + 1)
        self._requests += requests

    def _add(self, budget: int, accepted: int, count: int, rates: Sequence[float]) -> None:
        committed = accepted + 1
        whole_budget = accepted == budget
        further = _expected_further(rates, budget, self.max_gamma) if whole_budget else None
        for gamma in range(self.max_gamma + 1):
            if not whole_budget:
                steps = math.ceil(committed / (gamma + 1))
                tokens = 1 + min(accepted, gamma)
            elif gamma <= budget:
                steps = committed / (gamma + 1)
                tokens = 1 + gamma
            else:
                extra = further[gamma]
                steps = committed / (committed + extra)
                tokens = committed + extra
            self._steps_at[gamma] += count * steps
            self._committed_at[gamma] += count * tokens

    def compression(self) -> list[float] | None:
        """[E_cover[K] / E_step[K] for K = 0..max_gamma], or None before any step was tallied."""
        if self._requests <= 0.0 or self._tokens <= 0.0:
            return None
        factors = []
        for steps, committed in zip(self._steps_at, self._committed_at):
            per_step = committed / self._requests
            factors.append((self._tokens / steps) / per_step if steps > 0.0 and per_step > 0.0 else 1.0)
        return factors

    def summary(self) -> dict[str, object]:
        factors = self.compression()
        return {"compression": None if factors is None else [round(f, 4) for f in factors],
                "requests": round(self._requests, 1)}


def _expected_further(rates: Sequence[float], budget: int, max_gamma: int) -> list[float]:
    """Index K: drafts expected accepted past position ``budget`` with budget K, given it was reached."""
    further = [0.0] * (max_gamma + 1)
    reach, expected = 1.0, 0.0
    for gamma in range(budget + 1, max_gamma + 1):
        rate = rates[gamma - 1] if gamma - 1 < len(rates) else (rates[-1] if rates else 0.0)
        reach *= rate
        expected += reach
        further[gamma] = expected
    return further
