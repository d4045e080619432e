"""Per-position acceptance statistics, and the tokens a draft budget K is expected to commit.

For a verified request that drafted ``d`` tokens and had ``a`` accepted, positions 1..a are
successes, position a+1 is one failure when a < d, and later positions were not observed. Each
position j keeps a conditional rate p_j = P(draft j accepted | drafts 1..j-1 accepted) as an
exponentially weighted ratio of successes to trials (with a prior), so

    E[K] = 1 + sum_{i=1..K} prod_{j<=i} p_j          (p = 0.5, K = 3 gives 1.875)

is the expected number of tokens a request commits per step with budget K (the accepted drafts plus
the target's own token). This holds for any dependence between positions: it is the chain rule
applied to P(L >= i), L being the accepted run length.

How it forgets, and what it assumes about positions it does not see:

* Two memories per position: a short one (``memory_requests``) and a long one
  (``steady_memory_requests``, the one read). When they disagree beyond ``change_z`` standard
  errors the workload changed phase: the long memory restarts from the short one. So a steady
  phase gets precise rates (two arms 2% apart can be told apart) and a new phase is noticed within
  about ``memory_requests`` requests.
* Time for position j runs in *requests that drafted at least j tokens*, reached or not. So a batch
  of 64 adapts in as many requests as a batch of 1, though never faster than ``min_memory_steps``
  steps (scaled for the long memory); and a deep position that is rarely reached still forgets an
  old phase as fast as position 1. On a detected change, deeper positions drop their evidence and
  follow the chain prior until fresh data arrives.
* The prior of p_j is p_{j-1} (p_1's is ``prior_rate``, weight ``prior_weight``): without evidence a
  deeper position is assumed as good as the one before it, not reset to 0.5.
* A position nobody drafted lately (the policy sits at a smaller K) keeps the ratio to the previous
  position it had when last drafted. When the workload changes phase while the policy sits at K=1,
  p_1 moves and the undrafted p_2..p_K move with it, so the model sees that a deeper K has become
  worth a look instead of trusting numbers from another phase. Undrafted evidence also fades
  slowly (``stale_half_life_steps``), so that even at K = 0, where nothing is observed, the model
  drifts back to its prior and eventually asks for a probe.

Updates are O(distinct (drafted, accepted) pairs + positions); rates and E[K] are recomputed lazily
on the first read after an update. Memory is O(max_positions), whatever the run length.
"""

from __future__ import annotations

import math
from collections import Counter
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
        "_steady_request_decay",
        "_steady_step_decay",
        "_change_z",
        "_successes",
        "_trials",
        "_fast_successes",
        "_fast_trials",
        "_anchor",
        "_drafted_since_refresh",
        "_drafted_depth",
        "_rates",
        "_expected",
        "_stale",
        "total_trials",
        "updates",
        "phase_changes",
    )

    def __init__(
        self,
        max_positions: int = 16,
        *,
        prior_rate: float = 0.5,
        prior_weight: float = 2.0,
        memory_requests: float = 32.0,
        min_memory_steps: float = 8.0,
        steady_memory_requests: float = 256.0,
        change_z: float = 3.0,
        stale_half_life_steps: float = 64.0,
    ) -> None:
        for problem in _setting_problems(
            max_positions, prior_rate, prior_weight, memory_requests, min_memory_steps, steady_memory_requests,
            change_z, stale_half_life_steps,
        ):
            raise ValueError(f"acceptance: {problem}")
        self.max_positions = max_positions
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        self._request_decay = math.exp(-1.0 / memory_requests)
        self._step_decay = math.exp(-1.0 / min_memory_steps)
        stretch = steady_memory_requests / memory_requests
        self._steady_request_decay = math.exp(-1.0 / steady_memory_requests)
        self._steady_step_decay = math.exp(-1.0 / (min_memory_steps * stretch))
        self._change_z = change_z
        self._stale_decay = 0.5 ** (1.0 / stale_half_life_steps)
        size = max_positions + 1  # index j = position j; index 0 unused
        self._successes = [0.0] * size  # the steady (long-memory) estimate, the one we read
        self._trials = [0.0] * size
        self._fast_successes = [0.0] * size  # the short-memory estimate, to detect a change
        self._fast_trials = [0.0] * size
        self._anchor: list[float | None] = [None] * size  # p_{j-1} when position j was last drafted
        self._drafted_since_refresh = [False] * size
        self._drafted_depth = 0  # deepest position drafted by the previous update
        self._rates = [prior_rate] * size
        self._expected = [1.0] * size
        self._stale = True  # rates and E[K] need recomputing before the next read
        self.total_trials = 0.0
        self.updates = 0
        self.phase_changes = 0  # workload changes noticed (see _adopt_changes); read by the online policy

    # -- feeding ---------------------------------------------------------------------------------

    def update(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Fold in one verified step: per request, tokens drafted and tokens accepted."""
        top = self.max_positions
        runs_ending_at = [0] * (top + 1)  # requests whose accepted run is exactly a (clipped)
        drafts_ending_at = [0] * (top + 1)
        failures_at = [0] * (top + 2)
        # Few distinct (drafted, accepted) pairs per step; counting them in C keeps a batch of
        # 256 requests about as cheap as a batch of 8.
        for (drafted_tokens, accepted_tokens), requests in Counter(zip(drafted, accepted)).items():
            if not 0 <= accepted_tokens <= drafted_tokens <= top:  # clip what cannot be trusted
                drafted_tokens = min(max(0, int(drafted_tokens)), top)
                accepted_tokens = min(max(0, int(accepted_tokens)), drafted_tokens)
            runs_ending_at[accepted_tokens] += requests
            drafts_ending_at[drafted_tokens] += requests
            if accepted_tokens < drafted_tokens:
                failures_at[accepted_tokens + 1] += requests
        # From the deepest position up, so that "at least j" counts are running sums.
        reached_at = [0] * (top + 1)
        drafting_at = [0] * (top + 1)
        reached = drafting = 0
        for position in range(top, 0, -1):
            reached += runs_ending_at[position]
            drafting += drafts_ending_at[position]
            reached_at[position], drafting_at[position] = reached, drafting
        self._fold(reached_at, failures_at, drafting_at, depth=min(max(max(drafted, default=0), 0), top))

    def update_along_runs(self, offsets: Sequence[int], drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Fold in one verified step whose drafts start ``offsets[i]`` positions into a run.

        For drafters whose correct drafts come in runs that outlast a step (n-gram lookup copying
        its context): a request that accepted its whole draft last step continues its run, so this
        step's draft j is run position offset + j (``run_acceptance.py``). Positions past the
        tracked range share the last one.
        """
        top = self.max_positions
        reached_at = [0] * (top + 1)
        failures_at = [0] * (top + 2)
        drafting_at = [0] * (top + 1)
        depth = 0
        for (offset, drafted_tokens, accepted_tokens), requests in Counter(zip(offsets, drafted, accepted)).items():
            offset = max(0, int(offset))
            drafted_tokens = max(0, int(drafted_tokens))
            accepted_tokens = min(max(0, int(accepted_tokens)), drafted_tokens)
            for draft in range(1, drafted_tokens + 1):
                position = min(offset + draft, top)
                drafting_at[position] += requests
                if draft <= accepted_tokens:
                    reached_at[position] += requests
            if accepted_tokens < drafted_tokens:
                failures_at[min(offset + accepted_tokens + 1, top)] += requests
            depth = max(depth, min(offset + drafted_tokens, top))
        self._fold(reached_at, failures_at, drafting_at, depth=depth)

    def _fold(self, reached_at: list[int], failures_at: list[int], drafting_at: list[int], depth: int) -> None:
        """Per position j: ``reached_at[j]`` successes, ``failures_at[j]`` failures, and the decay of
        ``drafting_at[j]`` drafting requests (none: the slow fade of undrafted evidence)."""
        top = self.max_positions
        if depth < self._drafted_depth:
            # Positions are about to go undrafted: pin their anchors to the rates as they are now.
            self._refresh_if_stale()
        self._drafted_depth = depth
        # The decay factors only change where the number of drafting requests does, so they are
        # recomputed only there.
        last_drafting = 0
        fast_decay = steady_decay = self._stale_decay
        successes, trials = self._successes, self._trials
        fast_successes, fast_trials = self._fast_successes, self._fast_trials
        drafted_since_refresh = self._drafted_since_refresh
        new_trials_total = 0
        for position in range(top, 0, -1):
            drafting = drafting_at[position]
            if drafting != last_drafting:
                last_drafting = drafting
                if drafting:
                    fast_decay = max(self._request_decay**drafting, self._step_decay)
                    steady_decay = max(self._steady_request_decay**drafting, self._steady_step_decay)
                else:
                    fast_decay = steady_decay = self._stale_decay
            if drafting:
                drafted_since_refresh[position] = True
            reached = reached_at[position]
            new_trials = reached + failures_at[position]
            successes[position] = successes[position] * steady_decay + reached
            trials[position] = trials[position] * steady_decay + new_trials
            fast_successes[position] = fast_successes[position] * fast_decay + reached
            fast_trials[position] = fast_trials[position] * fast_decay + new_trials
            new_trials_total += new_trials
        self.total_trials += new_trials_total
        self.updates += 1
        self._stale = True

    # -- reading ---------------------------------------------------------------------------------

    def rate(self, position: int) -> float:
        """p_j for 1-based position j (positions past the tracked range repeat the last one)."""
        if position < 1:
            raise ValueError(f"position must be >= 1, got {position}")
        self._refresh_if_stale()
        return self._rates[min(position, self.max_positions)]

    def rates(self, depth: int | None = None) -> list[float]:
        """[p_1, ..., p_depth]."""
        depth = self.max_positions if depth is None else depth
        return [self.rate(position) for position in range(1, depth + 1)]

    def expected_committed(self, gamma: int) -> float:
        """E[K]: expected tokens a request commits in one step with draft budget ``gamma``."""
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self._refresh_if_stale()
        if gamma <= self.max_positions:
            return self._expected[gamma]
        expected = self._expected[-1]
        reach = math.prod(self._rates[1:])
        last_rate = self._rates[self.max_positions]
        for _ in range(gamma - self.max_positions):
            reach *= last_rate
            expected += reach
        return expected

    def expected_committed_curve(self) -> list[float]:
        """[E[0], E[1], ..., E[max_positions]]; the list is shared, do not modify it."""
        self._refresh_if_stale()
        return self._expected

    def evidence(self, position: int) -> float:
        """Effective (decayed) number of trials behind p_j."""
        return self._trials[min(max(position, 1), self.max_positions)]

    def summary(self) -> dict[str, Any]:
        self._refresh_if_stale()
        return {
            "rates": [round(rate, 4) for rate in self._rates[1:]],
            "evidence_trials": [round(trials, 1) for trials in self._trials[1:]],
            "expected_committed": [round(value, 4) for value in self._expected],
            "total_trials": round(self.total_trials, 1),
            "phase_changes": self.phase_changes,
        }

    # -- internals -------------------------------------------------------------------------------

    def _refresh_if_stale(self) -> None:
        if not self._stale:
            return
        self._adopt_changes()
        previous_rate = self.prior_rate
        reach = expected = 1.0
        for position in range(1, self.max_positions + 1):
            evidence_successes = self._successes[position]
            anchor = self._anchor[position]
            if self._drafted_since_refresh[position]:
                self._drafted_since_refresh[position] = False
                self._anchor[position] = previous_rate
            elif anchor is not None and anchor > 0.0:
                # Not drafted this deep lately: follow the previous position's move since then.
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
        self._stale = False

    def _adopt_changes(self) -> None:
        """Where the short memory disagrees with the long one beyond noise, the workload changed.

        The long memory gives precise rates in a steady phase (two arms 2% apart can be told
        apart); the short one notices a new phase within ``memory_requests`` requests. On a change
        at position j the long memory restarts from the short one there, and deeper positions drop
        their evidence: they are rarely reached, so they would hold the old phase for long; with
        no evidence they follow the chain prior (the changed position) until fresh data arrives.
        """
        for position in range(1, self.max_positions + 1):
            fast_trials, steady_trials = self._fast_trials[position], self._trials[position]
            if fast_trials < 4.0 or steady_trials <= fast_trials:
                continue
            fast_rate = self._fast_successes[position] / fast_trials
            steady_rate = self._successes[position] / steady_trials
            pooled = min(max(0.5 * (fast_rate + steady_rate), 0.05), 0.95)
            noise = math.sqrt(pooled * (1.0 - pooled) * (1.0 / fast_trials + 1.0 / steady_trials))
            if abs(fast_rate - steady_rate) > self._change_z * noise:
                self._successes[position] = self._fast_successes[position]
                self._trials[position] = self._fast_trials[position]
                for deeper in range(position + 1, self.max_positions + 1):
                    self._successes[deeper] = self._trials[deeper] = 0.0
                    self._fast_successes[deeper] = self._fast_trials[deeper] = 0.0
                    self._anchor[deeper] = None
                self.phase_changes += 1
                return


def _setting_problems(
    max_positions, prior_rate, prior_weight, memory_requests, min_memory_steps, steady_memory_requests, change_z,
    stale_half_life_steps,
):
    if not isinstance(max_positions, int) or max_positions < 1:
        yield f"max_positions must be an int >= 1, got {max_positions!r}"
    if not 0.0 <= prior_rate <= 1.0:
        yield f"prior_rate must be in [0, 1], got {prior_rate!r}"
    if not (math.isfinite(prior_weight) and prior_weight > 0.0):
        yield f"prior_weight must be a positive number, got {prior_weight!r}"
    if not (math.isfinite(memory_requests) and memory_requests >= 1.0):
        yield f"memory_requests must be >= 1, got {memory_requests!r}"
    if not (math.isfinite(min_memory_steps) and min_memory_steps >= 1.0):
        yield f"min_memory_steps must be >= 1, got {min_memory_steps!r}"
    if not (math.isfinite(steady_memory_requests) and steady_memory_requests >= memory_requests):
        yield f"steady_memory_requests must be >= memory_requests, got {steady_memory_requests!r}"
    if not (math.isfinite(change_z) and change_z > 0.0):
        yield f"change_z must be a positive number, got {change_z!r}"
    if not stale_half_life_steps > 0.0:
        yield f"stale_half_life_steps must be > 0, got {stale_half_life_steps!r}"
