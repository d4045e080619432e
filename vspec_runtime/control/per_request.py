"""Per-request draft lengths: spend a step's verification slots on the requests that will accept them.

The batch controller picks one K per step: the most any request drafts. Rows of one batch can differ
a lot (a request copying its prompt accepts almost every draft, an open question almost none), and a
batch-uniform K is then wrong for one of them. ``DraftAllocator`` trims each request's draft, after
the drafter made it and before the target verifies it, to the lengths that maximise the step's
expected committed tokens per millisecond:

* **Per-request acceptance** (``RequestAcceptance``): per request and draft position j, decayed
  counts of "draft j accepted | drafts 1..j-1 accepted", with the server's current rate of position j
  (all requests pooled, ``PooledRates``) as a prior of weight ``prior_weight``. A new request starts
  from what the server knows; a few verified steps of its own move it.
* **Step cost** (``StepCostLine``): step time against the tokens the target verifies, a line fitted by
  decayed least squares on pure-decode steps: ``fixed_ms + per_token_ms * tokens``. On a CPU the
  target's time grows with every verified token, so a slot that will be rejected costs real time; on
  a GPU at small batch the line is flat and nothing is trimmed.
* **Allocation** (``allocate``): slot (request i, position j) is worth its survival probability
  s_ij = p_i1 * ... * p_ij, the chance that draft j is accepted. Sorted by worth (a request's slots
  stay in order, since s only falls with j), the first n slots give
  ``rate(n) = (B + sum of their s) / (fixed_ms + per_token_ms * (B + n))``; the n with the highest rate
  is kept. O(S log S) for S offered drafts (B * K at most: 1,536 at batch 256 and K 6).

Lossless: a trimmed draft is a shorter draft, and verifying the kept tokens does not depend on the
dropped ones. A request trimmed to 0 still gets a one-token probe every ``probe_every`` of its steps,
so an estimate that fell can recover. Caps (the per-request opt-out through the OpenAI API) apply
after the allocation and are never probed past. Memory: one small record per live request, dropped
when the request finishes, and at most ``max_requests`` in any case (least recently seen first).

Pure Python, like everything in ``vspec_runtime.control``: the scheduler passes request ids and draft
lengths in and gets lengths back.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

# Acceptance bands of a request's first-position rate, for "where did the verification slots go".
BANDS = ((0.3, "low"), (0.7, "mid"), (math.inf, "high"))


def band_of(rate: float) -> str:
    return next(name for upper, name in BANDS if rate < upper)


def _decay_and_observe(successes: list[float], trials: list[float], depth: int, accepted: int,
                       decay: float) -> None:
    """One request-step that drafted ``depth`` positions (clipped by the caller): every drafted
    position decays, positions 1..accepted succeed, position accepted+1 fails when a draft was
    rejected. One pass: this runs for every request of every step."""
    kept = accepted if accepted < depth else depth
    for position in range(kept):
        successes[position] = successes[position] * decay + 1.0
        trials[position] = trials[position] * decay + 1.0
    for position in range(kept, depth):
        successes[position] *= decay
        trials[position] *= decay
    if kept < depth:
        trials[kept] += 1.0  # the first rejected draft


class PooledRates:
    """The server's conditional acceptance rate per position, every request pooled (the prior)."""

    def __init__(self, max_positions: int, *, decay: float = 0.995, prior_rate: float = 0.5,
                 prior_weight: float = 2.0) -> None:
        self.decay = decay
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        self.successes = [0.0] * max_positions
        self.trials = [0.0] * max_positions

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        _decay_and_observe(self.successes, self.trials, min(drafted, len(self.trials)), max(0, accepted), self.decay)

    def rates(self) -> list[float]:
        """p_j with the previous position's rate as the prior of the next (an unseen depth is as good)."""
        rates, prior = [], self.prior_rate
        for successes, trials in zip(self.successes, self.trials):
            prior = (successes + self.prior_weight * prior) / (trials + self.prior_weight)
            rates.append(prior)
        return rates


class _Request:
    __slots__ = ("successes", "trials", "steps_at_zero")

    def __init__(self, positions: int) -> None:
        self.successes = [0.0] * positions
        self.trials = [0.0] * positions
        self.steps_at_zero = 0  # consecutive steps this request was offered drafts and kept none


class RequestAcceptance:
    """Per request, per position: decayed successes / trials, shrunk toward a prior rate per position."""

    def __init__(self, max_positions: int, *, decay: float = 0.9, prior_weight: float = 2.0,
                 max_requests: int = 8192) -> None:
        self.max_positions = max_positions
        self.decay = decay  # per verified step of that request: its own recent steps count most
        self.prior_weight = prior_weight
        self.max_requests = max_requests
        self._requests: OrderedDict[str, _Request] = OrderedDict()

    def __len__(self) -> int:
        return len(self._requests)

    def _record(self, request_id: str) -> _Request:
        record = self._requests.get(request_id)
        if record is None:
            record = self._requests[request_id] = _Request(self.max_positions)
            if len(self._requests) > self.max_requests:
                self._requests.popitem(last=False)  # a request that finished without us hearing of it
        else:
            self._requests.move_to_end(request_id)
        return record

    def observe(self, request_id: str, drafted: int, accepted: int) -> None:
        self.observe_step(((request_id, drafted, accepted),))

    def observe_step(self, outcomes: Iterable[tuple[str, int, int]]) -> None:
        """``observe`` for every (request, drafted, accepted) of one step.

        This runs for every request of every step (the batch's own acceptance): at batch 256 it was
        most of the online policy's time per step, so the lookups are hoisted out of the loop
        (``_decay_and_observe`` makes the decay and the new trial one pass).
        """
        records, decay, top = self._requests, self.decay, self.max_positions
        for request_id, drafted, accepted in outcomes:
            if drafted <= 0:
                continue
            record = records.get(request_id)
            if record is None:
                record = self._record(request_id)
            else:
                records.move_to_end(request_id)
            depth = drafted if drafted < top else top
            _decay_and_observe(record.successes, record.trials, depth, accepted, decay)

    def survival(self, request_id: str, prior: Sequence[float], depth: int) -> list[float]:
        """s_j = P(drafts 1..j all accepted) for j = 1..depth."""
        record = self._requests.get(request_id)
        survival, alive = [], 1.0
        for position in range(min(depth, self.max_positions)):
            rate = prior[position] if position < len(prior) else (prior[-1] if prior else 0.5)
            if record is not None and record.trials[position] > 0.0:
                rate = (record.successes[position] + self.prior_weight * rate) / (
                    record.trials[position] + self.prior_weight)
            alive *= rate
            survival.append(alive)
        return survival

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def clear(self) -> None:
        self._requests.clear()

    def steps_at_zero(self, request_id: str) -> int:
        record = self._requests.get(request_id)
        return record.steps_at_zero if record is not None else 0

    def mark_kept(self, request_id: str, kept: int) -> None:
        if request_id in self._requests or kept == 0:
            record = self._record(request_id)
            record.steps_at_zero = 0 if kept else record.steps_at_zero + 1


class StepCostLine:
    """Step time = fixed_ms + per_token_ms * verified tokens, by decayed least squares."""

    def __init__(self, *, decay: float = 0.98, min_samples: float = 8.0, min_variance: float = 0.0) -> None:
        self.decay = decay
        self.min_samples = min_samples
        self.min_variance = min_variance  # of the tokens, below which the slope is not trusted
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: float, interval_ms: float) -> None:
        if tokens <= 0 or not math.isfinite(interval_ms) or interval_ms <= 0.0:
            return
        d = self.decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + tokens
        self._y = self._y * d + interval_ms
        self._xx = self._xx * d + tokens * tokens
        self._xy = self._xy * d + tokens * interval_ms

    def line(self) -> Optional[tuple[float, float]]:
        """(fixed_ms, per_token_ms), or None until enough varied samples exist."""
        if self._w < self.min_samples:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x <= max(1e-9 * max(1.0, mean_x * mean_x), self.min_variance):
            return None  # every step verified (about) the same number of tokens: the slope is unknown
        slope = (self._xy / self._w - mean_x * mean_y) / var_x
        slope = max(slope, 0.0)
        return max(mean_y - slope * mean_x, 0.0), slope


def allocate(offered: Mapping[str, int], survival: Mapping[str, Sequence[float]],
             fixed_ms: float, per_token_ms: float) -> dict[str, int]:
    """Drafts to keep per request: the prefix of slots, by worth, with the highest tokens per ms."""
    batch = len(offered)
    if batch == 0:
        return {}
    slots = sorted((-worth, position, request_id)
                   for request_id, count in offered.items()
                   for position, worth in enumerate(survival[request_id][:count]))
    value = float(batch)  # every request commits the target's own token
    best_rate, best_n = value / (fixed_ms + per_token_ms * batch), 0
    for n, (negative_worth, _, _) in enumerate(slots, 1):
        value -= negative_worth
        rate = value / (fixed_ms + per_token_ms * (batch + n))
        if rate > best_rate:
            best_rate, best_n = rate, n
    kept = Counter(request_id for _, _, request_id in slots[:best_n])
    return {request_id: kept.get(request_id, 0) for request_id in offered}


class DraftAllocator:
    """Per-request draft lengths for one engine: observe verified steps, trim the next drafts."""

    def __init__(self, max_positions: int, *, probe_every: int = 8) -> None:
        self.max_positions = max_positions
        self.probe_every = probe_every
        self.pooled = PooledRates(max_positions)
        self.requests = RequestAcceptance(max_positions)
        self.cost = StepCostLine()
        # What users and the trace see: drafts offered and kept, per-request lengths, slots by band.
        self.steps_trimmed = 0
        self.offered_total = 0
        self.kept_total = 0
        self.lengths_histogram: Counter[int] = Counter()
        self.slots_by_band: Counter[str] = Counter()
        self.last: dict[str, Any] = {}

    # --- what the scheduler reports --------------------------------------------------------------

    def observe_step(self, request_ids: Sequence[str], drafted: Sequence[int], accepted: Sequence[int],
                     batched_tokens: int, interval_ms: float, pure_decode: bool) -> None:
        for made, taken in zip(drafted, accepted):
            self.pooled.observe(made, taken)
        self.requests.observe_step(zip(request_ids, drafted, accepted))
        if pure_decode:
            self.cost.observe(batched_tokens, interval_ms)

    def finished(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self.requests.forget(request_id)

    # --- what the scheduler asks -----------------------------------------------------------------

    def lengths(self, offered: Mapping[str, int], caps: Mapping[str, int]) -> dict[str, int]:
        """Drafts to keep per request (<= offered). Until the cost line is known: all (then caps)."""
        offered = {rid: count for rid, count in offered.items() if count > 0}
        line = self.cost.line()
        survival: dict[str, list[float]] = {}
        if line is None or not offered:
            kept = dict(offered)
        else:
            prior = self.pooled.rates()
            survival = {rid: self.requests.survival(rid, prior, count) for rid, count in offered.items()}
            kept = allocate(offered, survival, *line)
            for rid, count in kept.items():
                if count == 0 and self.requests.steps_at_zero(rid) + 1 >= self.probe_every:
                    kept[rid] = 1  # a probe: without one, a request at 0 could never show it improved
        for rid, cap in caps.items():
            if rid in kept:
                kept[rid] = min(kept[rid], max(cap, 0))
        self._account(offered, kept, survival)
        return kept

    def _account(self, offered: Mapping[str, int], kept: Mapping[str, int],
                 survival: Mapping[str, Sequence[float]]) -> None:
        offered_slots, kept_slots = sum(offered.values()), sum(kept.values())
        self.offered_total += offered_slots
        self.kept_total += kept_slots
        self.steps_trimmed += int(kept_slots < offered_slots)
        for rid, count in kept.items():
            self.lengths_histogram[count] += 1
            self.requests.mark_kept(rid, count)
            if survival and count:
                self.slots_by_band[band_of(survival[rid][0])] += count
        self.last = {"offered": offered_slots, "kept": kept_slots}

    def summary(self) -> dict[str, Any]:
        line = self.cost.line()
        return {
            "offered_drafts": self.offered_total,
            "kept_drafts": self.kept_total,
            "steps_trimmed": self.steps_trimmed,
            "lengths": {str(k): v for k, v in sorted(self.lengths_histogram.items())},
            "slots_by_band": dict(sorted(self.slots_by_band.items())),
            "cost_line_ms": [round(line[0], 4), round(line[1], 5)] if line else None,
            "tracked_requests": len(self.requests),
        }
