"""What the requests of the running batch are expected to commit per step, from their own acceptance.

The pooled acceptance model (``acceptance.py``) answers "what does a request commit at budget K" for
recent requests as a whole. A batch is not an average of recent requests. When a closed batch drains,
the requests left are the ones that accept least (they need the most steps), and the pooled model,
filled by the fast requests that finished, keeps K high for them. Measured on the demo's code prompts
at batch 8 (docs/benchmarks.md, "Where online loses on code@8"): every fixed K spent about the same
5 s while all eight requests ran, and the cell was decided by the draining tail, 0.8 s at K=1
against 1.3-1.7 s for online starting the tail at K 5-6.

So the online policy's E[K] is the mean over the requests of the latest step of each request's own
curve, E_r[K] = 1 + sum_{i<=K} s_r(i), where s_r(i) is the request's survival to draft i from its
decayed per-position rates shrunk toward the pooled rates (``RequestAcceptance``, shared with
per-request draft lengths). A request with no history yet (just admitted) gets the pooled curve, so a
batch of new requests reads exactly as before. Trials are budget trials, as in the pooled model: on
a stable step every request of the batch had K positions, and one the drafter left empty failed at
the first. Requests that cannot draft at all (``StepFeedback.cannot_draft``) are left out of both.

Large batches read the pooled curve: past ``max_tracked`` requests (32) nothing is tracked per
request, and the records are dropped. Pure-Python bookkeeping of every request cost 0.3 ms a step at
batch 256, three times the online policy's budget (docs/benchmarks.md, "Controller cost per step"),
and it buys little there: a batch that large is close to the recent requests the pooled model counts,
and what this model exists for, the few slow requests a draining batch leaves, is small. A request's
own rates forget at 0.9 a step, so once a batch drains to ``max_tracked`` its requests have curves of
their own within a few steps (until then they read the pooled one, as new requests do). Reading a
random sample of a large batch instead was tried: 32 or 64 requests of a batch whose every fourth
request copies read E[K] up to 17% off, and 64 a step still cost 0.13 ms at batch 256.

Memory: one record per recently seen request (least recently seen dropped past ``max_requests``),
positions each. Work: at most ``max_tracked`` requests x K per step.
"""

from __future__ import annotations

from collections.abc import Sequence

from vspec_runtime.control.base import StepFeedback
from vspec_runtime.control.per_request import RequestAcceptance


class BatchAcceptance:
    """Per-request acceptance of the requests in the latest step, read as one E[K] curve."""

    def __init__(self, max_positions: int, *, max_requests: int = 4096, max_tracked: int = 32) -> None:
        if max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {max_tracked}")
        self.max_tracked = max_tracked
        self.requests = RequestAcceptance(max(1, max_positions), max_requests=max_requests)
        self.batch: tuple[str, ...] = ()  # the latest step's requests: the best guess of the next batch

    def observe(self, feedback: StepFeedback) -> None:
        able = feedback.able_requests()
        if len(able) > self.max_tracked:
            self.batch = ()  # read the pooled curve
            self.requests.clear()
            return
        if not (feedback.stable and feedback.gamma > 0) and not feedback.request_ids:
            self.batch = able
            return  # nothing drafted (a K=0 step): no trials, and this runs on every step
        trials = feedback.trials_by_request()
        self.batch = tuple(request for request, _, _ in trials)
        self.requests.observe_step(trials)

    def expected_committed_curve(self, pooled_rates: Sequence[float], pooled_curve: Sequence[float]) -> list[float]:
        """E[K] for K = 0..len(pooled_curve)-1, averaged over the batch; the pooled curve without one."""
        if not self.batch:
            return list(pooled_curve)
        depth = len(pooled_curve) - 1
        totals = [0.0] * (depth + 1)
        for request_id in self.batch:
            committed = 1.0
            totals[0] += committed
            for k, alive in enumerate(self.requests.survival(request_id, pooled_rates, depth), start=1):
                committed += alive
                totals[k] += committed
        return [total / len(self.batch) for total in totals]

