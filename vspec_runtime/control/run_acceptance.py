"""Acceptance along runs of copyable text: what a budget K commits when correct drafts come in runs.

The step model (``acceptance.py``) numbers draft positions from 1 at every step: p_j is the chance
that draft j of a step is accepted once drafts 1..j-1 were. That is right for a model drafter, which
drafts anew from the verified context each step. It is wrong for n-gram lookup. Its drafts copy the
context, so they are right in runs the text decides (a function signature repeated from the prompt,
a quoted line), and a run outlasts a step: after a step that accepted its whole draft, the next draft
continues the same run. Then how K cuts a run into steps decides what each position's rate looks
like, and rates measured at one K mislead about another. On the demo's code prompts (runs of about
seven tokens, three per 64-token answer) the first draft of a step is accepted 29% of the time at
K=1 (runs take several steps, most of them inside a run) and 11.5% at K=6 (one step per run): sat at
K=1 the step model expected K=6 to commit 25% more than it does, sat at K=6 it expected K=1 to commit
17% less. The online policy chased that bias between K=6 and K=0 and ran 0.93-0.95x the best fixed
K on code (docs/benchmarks.md, run 8). Opt-in (``adaptive.acceptance_model = "run"``): in the
simulator it removes that loss, on the demo bench it has not resolved a gain yet (run 10).

This model numbers positions along the run instead. A request that accepted its whole budget K last
step starts this step at run position offset + K + 1 (the target's own token, produced after the last
accepted draft, is the run's next token: it is what the drafter would have proposed); any other
request starts a fresh run at 0. ``AcceptanceStats.update_along_runs`` folds the trials in at those
positions, so p_j is the chance that the text can still be copied at its j-th token: a property of
the text, not of K. What a budget K commits then follows from renewal: a cycle is one run plus the
fresh token that ends it, so

    tokens per cycle = sum_{j>=0} S(j)            S(j) = p_1 ... p_j, S(0) = 1
    steps per cycle  = sum_{m>=0} S(m (K + 1))    (step m of a run starts after m full steps)
    E[K] = tokens per cycle / steps per cycle

For K = 0 the two sums are equal (E = 1). When the rates are the same at every position (no runs:
acceptance without memory), E[K] = 1 + p + ... + p^K, the step model's formula, so nothing changes
where runs do not exist. Positions past the tracked range repeat the last rate (a geometric tail).

The rates keep every rule of ``AcceptanceStats`` (two memories, change detection, the chain prior,
the fade of undrafted evidence); bonus positions (K + 1, 2K + 2, ... are never drafted at a steady K)
follow the position before them. Memory: one offset per recently seen request (least recently seen
dropped past ``max_requests``) and the rates of ``positions`` run positions. Work per step: the
requests' drafts (batch x K), and positions x K per curve.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.base import StepFeedback

__all__ = ["RunAcceptance", "expected_committed_along_runs"]

STARTS_MEMORY_REQUESTS = 1024.0  # long memory of the start rate, in fresh drafts (see RunAcceptance)
MIN_EVIDENCE = 1.0  # decayed trials below which a run position reads its neighbours (``RunAcceptance.rates``)


def expected_committed_along_runs(rates: Sequence[float], max_gamma: int) -> list[float]:
    """[E[0], ..., E[max_gamma]] from run-position rates p_1..p_J (see the module docstring)."""
    survival = [1.0]
    for rate in rates:
        survival.append(survival[-1] * rate)
    depth = len(rates)
    tail = rates[-1] if rates else 0.0  # < 1: AcceptanceStats caps every rate below 1

    def reach(position: int) -> float:
        if position <= depth:
            return survival[position]
        return survival[depth] * tail ** (position - depth)

    tokens = sum(survival) + (survival[depth] * tail / (1.0 - tail) if tail < 1.0 else 0.0)
    curve = []
    for gamma in range(max_gamma + 1):
        stride = gamma + 1
        steps, start = 0.0, 0
        while start <= depth:
            steps += survival[start]
            start += stride
        # Steps that start past the tracked range: a geometric series in tail ** stride.
        steps += reach(start) / (1.0 - tail**stride) if tail < 1.0 else 0.0
        curve.append(tokens / steps)
    return curve


class RunAcceptance:
    """Acceptance rates along runs, fed from verified steps, read as an E[K] curve."""

    def __init__(self, max_gamma: int, *, positions: int | None = None, max_requests: int = 4096,
                 memory_requests: float = 32.0, stale_half_life_steps: float = 64.0) -> None:
        self.max_gamma = max(1, max_gamma)
        # Deep enough for a few steps of a run at the largest K; past it the tail is geometric.
        self.positions = positions or max(32, 4 * (self.max_gamma + 1))
        # Starting a run and going on with one are different events: kept apart, so that neither
        # the chain prior nor the follow-the-previous-position rule of AcceptanceStats carries the
        # rare start of a run into the positions inside one (run position j >= 2 is position j - 1
        # of ``continues``).
        settings = dict(memory_requests=memory_requests, stale_half_life_steps=stale_half_life_steps)
        # A run starts at a few percent of the fresh drafts (7% on the demo's code): the long memory
        # of the step model (256 requests) would hold about 18 starts, 17% noise on every K's gain.
        # Four times as long holds 4x the starts; a new workload is still caught by the short memory.
        self.starts = AcceptanceStats(1, steady_memory_requests=STARTS_MEMORY_REQUESTS, **settings)
        self.continues = AcceptanceStats(self.positions - 1, **settings)
        self.max_requests = max_requests
        self._offsets: OrderedDict[str, int] = OrderedDict()  # request -> run position its next draft starts at
        self._curve: list[float] | None = None
        self._updates = 0  # steps folded in
        self._curve_at = -1  # _updates when the curve was computed

    def observe(self, feedback: StepFeedback) -> None:
        """Fold in one step's budget trials at their run positions, and move each request's offset."""
        trials = feedback.trials_by_request()
        if not trials:
            # Without request identities runs cannot be followed: every draft starts a run.
            drafted, accepted = feedback.acceptance_trials()
            if drafted:
                self._fold((0,) * len(drafted), drafted, accepted)
            return
        if not any(made for _, made, _ in trials):
            # Nothing drafted (K=0): the target's one token per request leaves the runs untracked.
            for request, _, _ in trials:
                self._offsets.pop(request, None)
            return
        requests, drafted, accepted = zip(*trials)
        offsets = tuple(self._offsets.get(request, 0) for request in requests)
        self._fold(offsets, drafted, accepted)
        budget = feedback.gamma if feedback.stable else 0
        for (request, made, taken), offset in zip(trials, offsets):
            # A whole budget accepted: the run goes on past the target's own token. Anything else
            # (a rejection, a short or empty draft, a step without one budget) ends it.
            self._offsets[request] = offset + budget + 1 if budget and made == taken == budget else 0
            self._offsets.move_to_end(request)
        while len(self._offsets) > self.max_requests:
            self._offsets.popitem(last=False)

    def _fold(self, offsets: tuple[int, ...], drafted: tuple[int, ...], accepted: tuple[int, ...]) -> None:
        """Trials of run position 1 to ``starts``, of the positions after it to ``continues``."""
        starting = [(made, taken) for offset, made, taken in zip(offsets, drafted, accepted) if offset == 0]
        self.starts.update([min(made, 1) for made, _ in starting], [min(taken, 1) for _, taken in starting])
        going_on = [(offset - 1, made, taken) for offset, made, taken in zip(offsets, drafted, accepted) if offset]
        # A fresh draft whose first token was accepted goes on into the run with its other drafts.
        going_on += [(0, made - 1, taken - 1) for made, taken in starting if taken >= 1 and made > 1]
        if going_on:
            self.continues.update_along_runs(*zip(*going_on))
        self._updates += 1

    def expected_committed_curve(self) -> list[float]:
        """E[K] for K = 0..max_gamma, recomputed only after new trials."""
        if self._curve is None or self._curve_at != self._updates:
            self._curve = expected_committed_along_runs(self.rates(), self.max_gamma)
            self._curve_at = self._updates
        return self._curve

    def rates(self) -> list[float]:
        """p_1..p_J, with the positions no draft reaches lately read from their neighbours in the run.

        At a steady K the target's own token takes run positions K + 1, 2K + 2, ...: no draft is
        ever verified there. The step model's chain prior (a position is as good as the one before)
        would give position 2 at K=1 the rate of position 1, the chance that a run *starts*, and
        cut every run short in the model: sat at K=1 it saw no gain in any K and went to K=0.
        Inside a run the chance of going on is what the neighbours show, so such a position reads
        the mean of the nearest positions with evidence on either side (position 1 is never a
        neighbour: starting a run is another event).
        """
        rates = [self.starts.rate(1), *self.continues.rates()]
        evidence = [self.starts.evidence(1)] + [self.continues.evidence(j) for j in range(1, self.positions)]
        evidenced = [trials >= MIN_EVIDENCE for trials in evidence]
        filled = list(rates)
        for index in range(1, len(rates)):
            if evidenced[index]:
                continue
            later = next((rates[i] for i in range(index + 1, len(rates)) if evidenced[i]), None)
            earlier = filled[index - 1] if index >= 2 else None
            neighbours = [rate for rate in (earlier, later) if rate is not None]
            if neighbours:
                filled[index] = sum(neighbours) / len(neighbours)
        return filled

