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
* the whole budget was accepted (a = K') and K <= K': K's steps over the known drafts commit K + 1
  each, and the one that reaches past them counts for the share of its tokens inside the c, from how
  far the run is expected to go on (pooled rates): c / (K + 1) steps when it surely goes on, the
  ceiling when it surely ends (``_steps_within_whole_budget``);
* a = K' and K > K': c / (c + x) steps, x the tokens the longer budget is expected to accept past K'
  (from the pooled position rates: the run is known to reach K' + 1 only).

Then E_cover[K] = (sum of c) / (sum of steps at K): tokens per step over the text the steps covered,
which is what fixed K would commit on it. Beside it the plain mean over the same steps,
E_step[K] = mean(1 + min(a, K)) (extrapolated the same way), and ``compression()`` returns
(E_cover[K] - 1) / (E_step[K] - 1), the drafts K accepts per step over the text for each one the
per-step mean promises (below 1 where runs make K's steps fewer, above 1 below the K the steps ran).
The online policy scales the accepted drafts of the curve it reads (the batch's own or the pooled
one) by it, E[K] = 1 + (E_read[K] - 1) x factor[K]: the batch model keeps telling which requests run
now, the factor how K cuts their text into steps. Scaling the drafts, not E itself, keeps E >= 1 when
a factor learned on text with runs meets a cell with almost none: multiplied whole, code's 0.87 at
K=6 read chat's E[6] of 1.07 as 0.93 on the demo bench (run 16), and online held chat@1 at K 1-2. The run model
(``run_acceptance.py``) answers the same question by numbering positions along runs; this one keeps
the step model's positions and weights its steps instead.

Memory: two curves of max_gamma + 1 sums, forgotten per request-step over ``memory_requests`` (the
steady horizon of the pooled model) and cleared when the pooled model sees a new phase, plus the
cost vectors of at most max_gamma (max_gamma + 1) / 2 (budget, accepted) pairs, worked out once.
Work per step: counting the batch's accepted values (C speed), then max_gamma + 1 adds per distinct
value; a read is max_gamma + 1 divisions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

__all__ = ["CoverageTally"]


class CoverageTally:
    """Per K: tokens per step over the text recent steps covered, against their plain per-step mean."""

    __slots__ = ("max_gamma", "_decay", "_unit", "_requests", "_tokens", "_steps_at", "_committed_at", "_ended",
                 "_whole", "_whole_rates")

    def __init__(self, max_gamma: int, *, memory_requests: float = 256.0) -> None:
        if max_gamma < 0:
            raise ValueError(f"max_gamma must be >= 0, got {max_gamma}")
        if not (math.isfinite(memory_requests) and memory_requests >= 1.0):
            raise ValueError(f"memory_requests must be >= 1, got {memory_requests!r}")
        self.max_gamma = max_gamma
        self._decay = math.exp(-1.0 / memory_requests)
        # (budget K', accepted a < K') -> (steps, tokens) at each K: a run that ended inside the step
        # costs the same at K whatever the rates, so each pair's vectors are worked out once.
        self._ended: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        # budget K' -> (steps, tokens) at each K for a wholly accepted step, priced with ``_whole_rates``:
        # the caller passes the same rates until its next decision, so most steps reuse them.
        self._whole: dict[int, tuple[list[float], list[float]]] = {}
        self._whole_rates: Sequence[float] | None = None
        self.clear()

    def clear(self) -> None:
        """Forget everything (the workload changed phase)."""
        # Sums are stored in units of ``_unit``, which grows as old steps fade: forgetting is then one
        # division per step, not one per stored number.
        self._unit = 1.0
        self._requests = 0.0  # request-steps tallied
        self._tokens = 0.0  # tokens they committed
        self._steps_at = [0.0] * (self.max_gamma + 1)  # steps K would have taken over those tokens
        self._committed_at = [0.0] * (self.max_gamma + 1)  # tokens K would have committed at those steps

    def update(self, budget: int, accepted: Sequence[int], rates: Sequence[float]) -> None:
        """Fold in one stable step: ``budget`` K' every request had, ``accepted`` drafts per request
        (budget trials: an empty draft accepted 0), ``rates`` the pooled p_1, p_2, ... (as read at the
        latest decision) that price what a longer budget accepts past a wholly accepted one."""
        if budget <= 0 or not accepted:
            return
        self._unit /= self._decay ** len(accepted)
        unit = self._unit
        steps_at, committed_at = self._steps_at, self._committed_at
        for accepted_tokens, count in Counter(accepted).items():
            accepted_tokens = min(max(int(accepted_tokens), 0), budget)
            steps, tokens = self._costs(budget, accepted_tokens, rates)
            weight = count * unit
            for gamma in range(self.max_gamma + 1):
                steps_at[gamma] += weight * steps[gamma]
                committed_at[gamma] += weight * tokens[gamma]
            self._requests += weight
            self._tokens += weight * (accepted_tokens + 1)
        if unit > 1e100:  # keep the stored numbers finite over any run length
            self._rescale(1.0 / unit)

    def _costs(self, budget: int, accepted: int, rates: Sequence[float]) -> tuple[list[float], list[float]]:
        """(steps, tokens) at each K for the ``accepted + 1`` tokens one request-step committed."""
        committed = accepted + 1
        if accepted < budget:  # the run ended inside the step
            key = (budget, accepted)
            if key not in self._ended:
                self._ended[key] = (
                    [float(math.ceil(committed / (gamma + 1))) for gamma in range(self.max_gamma + 1)],
                    [float(1 + min(accepted, gamma)) for gamma in range(self.max_gamma + 1)],
                )
            return self._ended[key]
        if rates is not self._whole_rates:
            self._whole_rates, self._whole = rates, {}
        if budget not in self._whole:
            self._whole[budget] = self._whole_budget_costs(budget, rates)
        return self._whole[budget]

    def _whole_budget_costs(self, budget: int, rates: Sequence[float]) -> tuple[list[float], list[float]]:
        """(steps, tokens) at each K for a step that accepted its whole budget K' (module docstring)."""
        committed = budget + 1
        further = _expected_further(rates, budget, budget + self.max_gamma)
        steps, tokens = [], []
        for gamma in range(self.max_gamma + 1):
            if gamma <= budget:  # K cuts the same tokens finer
                steps.append(_steps_within_whole_budget(budget, gamma, further))
                tokens.append(1.0 + gamma)
            else:  # the longer budget would have gone on accepting
                steps.append(committed / (committed + further[gamma]))
                tokens.append(committed + further[gamma])
        return steps, tokens

    def _rescale(self, factor: float) -> None:
        self._steps_at = [value * factor for value in self._steps_at]
        self._committed_at = [value * factor for value in self._committed_at]
        self._requests *= factor
        self._tokens *= factor
        self._unit *= factor

    def expected_committed(self) -> list[float] | None:
        """[E_cover[K] for K = 0..max_gamma]: tokens per step over the text covered (None: nothing yet)."""
        if self._requests <= 0.0:
            return None
        return [self._tokens / steps if steps > 0.0 else 1.0 for steps in self._steps_at]

    def per_step_expected(self) -> list[float] | None:
        """[E_step[K] for K = 0..max_gamma]: the plain mean over the same steps (None: nothing yet)."""
        if self._requests <= 0.0:
            return None
        return [committed / self._requests for committed in self._committed_at]

    def compression(self) -> list[float] | None:
        """[(E_cover[K] - 1) / (E_step[K] - 1) for K = 0..max_gamma]: how many drafts K accepts per step
        over the text covered, for each one the per-step mean promises (1 where it promises none);
        None before any step was tallied."""
        cover, per_step = self.expected_committed(), self.per_step_expected()
        if cover is None or per_step is None:
            return None
        return [(covered - 1.0) / (stepped - 1.0) if stepped - 1.0 > 1e-9 else 1.0
                for covered, stepped in zip(cover, per_step)]

    def summary(self) -> dict[str, object]:
        factors = self.compression()
        return {"compression": None if factors is None else [round(f, 4) for f in factors],
                "requests": round(self._requests / self._unit, 1)}


def _steps_within_whole_budget(budget: int, gamma: int, further: Sequence[float]) -> float:
    """Steps K = ``gamma`` <= ``budget`` takes over the budget + 1 tokens of a wholly accepted step.

    Its drafts 1..budget are known right; the (budget+1)-th token was the target's, never drafted.
    K's steps that draft known positions only commit K + 1 each; the step that reaches past them
    commits the known drafts left, what it is expected to accept past the budget (``further``, from
    the pooled rates), and its own token, and counts for the share of that which lies inside the
    tokens covered. A run that surely goes on gives (budget + 1) / (K + 1), one that surely ends the
    ceiling of it, as for a run that ended inside a step.
    """
    stride = gamma + 1
    full_steps = (budget - gamma) // stride + 1  # steps whose drafts all lie at known positions
    start = full_steps * stride  # where the next step starts, in tokens from the step's start
    if start > budget:
        return float(full_steps)
    known_left = budget - start  # drafts of that step at positions known right
    unknown = gamma - known_left  # its drafts past the budget (>= 1)
    reached = known_left + 1.0 + further[budget + unknown]
    return full_steps + (budget + 1 - start) / reached


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
