"""Sliding-window measurements of one arm (one K in one batch-size bucket), and the bucket rule.

An arm keeps its last ``size`` stable steps with running sums, so every estimate is a ratio of sums
(total tokens over total milliseconds) rather than a mean of per-step ratios: a slow step weighs in
by its length, which is what goodput means. Memory is O(size) per arm.
"""

from __future__ import annotations

from collections import deque


def bucket_of(batch_size: int) -> int:
    """The batch-size bucket: the next power of two >= batch_size (1, 2, 4, 8, ...)."""
    if batch_size <= 1:
        return 1
    return 1 << (batch_size - 1).bit_length()


class ArmWindow:
    """The last ``size`` stable steps run with one K in one bucket."""

    __slots__ = (
        "size",
        "_samples",
        "requests",
        "interval_ms",
        "tokens",
        "verified",
        "verified_ratios",
        "verified_squares",
        "cost_sum",
        "cost_squares",
        "last_step",
        "total_samples",
        "_median",
        "_clipped_with",
    )

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"window size must be >= 1, got {size}")
        self.size = size
        self._samples: deque[tuple[int, float, int, int]] = deque()
        self.requests = 0  # sum of batch sizes in the window
        self.interval_ms = 0.0
        self.tokens = 0  # committed tokens in the window
        self.verified = 0  # tokens the target verified in the window (a request's own token included)
        # Sum over samples of the tokens verified per request, and of its square: for its spread.
        self.verified_ratios = 0.0
        self.verified_squares = 0.0
        # Sum and sum of squares of the per-sample cost (ms per request), for the noise estimate.
        self.cost_sum = 0.0
        self.cost_squares = 0.0
        self.last_step = -1  # policy step of the newest sample
        self.total_samples = 0  # ever, for the UCB count of the bucket
        # The stall check runs on every arm every step, but only one arm gets a sample per step:
        # the median and the last clip stay valid until this window changes.
        self._median: float | None = None
        self._clipped_with: tuple[float, float] | None = None

    def add(self, requests: int, interval_ms: float, tokens: int, step: int, verified: int | None = None) -> None:
        """One stable step; ``verified`` defaults to one token a request (nothing drafted)."""
        verified = requests if verified is None else verified
        self._median = self._clipped_with = None
        self._samples.append((requests, interval_ms, tokens, verified))
        self.requests += requests
        self.interval_ms += interval_ms
        self.tokens += tokens
        self.verified += verified
        ratio = verified / requests
        self.verified_ratios += ratio
        self.verified_squares += ratio * ratio
        cost = interval_ms / requests
        self.cost_sum += cost
        self.cost_squares += cost * cost
        if len(self._samples) > self.size:
            old_requests, old_interval_ms, old_tokens, old_verified = self._samples.popleft()
            self.requests -= old_requests
            self.interval_ms -= old_interval_ms
            self.tokens -= old_tokens
            self.verified -= old_verified
            old_ratio = old_verified / old_requests
            self.verified_ratios -= old_ratio
            self.verified_squares -= old_ratio * old_ratio
            old_cost = old_interval_ms / old_requests
            self.cost_sum -= old_cost
            self.cost_squares -= old_cost * old_cost
        self.last_step = step
        self.total_samples += 1

    def clip_costs(self, limit_ms_per_request: float, replacement_ms_per_request: float | None = None) -> None:
        """Rewrite samples costlier than the limit (stalls) as costing ``replacement`` (default: the limit)."""
        replacement = limit_ms_per_request if replacement_ms_per_request is None else replacement_ms_per_request
        if self._clipped_with == (limit_ms_per_request, replacement):
            return  # clipped with these limits since the last change: nothing left over them
        self._clipped_with = (limit_ms_per_request, replacement)
        if not self._samples or self.cost_sum / len(self._samples) <= limit_ms_per_request / len(self._samples):
            return  # even one sample over the limit would push the mean over limit/count
        rebuilt = [
            (requests, replacement * requests if interval_ms > limit_ms_per_request * requests else interval_ms, tokens,
             verified)
            for requests, interval_ms, tokens, verified in self._samples
        ]
        if rebuilt == list(self._samples):
            return
        self._samples = deque(rebuilt)
        self._median = None
        self.interval_ms = sum(interval_ms for _, interval_ms, _, _ in rebuilt)
        costs = [interval_ms / requests for requests, interval_ms, _, _ in rebuilt]
        self.cost_sum = sum(costs)
        self.cost_squares = sum(cost * cost for cost in costs)

    def median_cost(self) -> float:
        if self._median is None:
            costs = sorted(interval_ms / requests for requests, interval_ms, _, _ in self._samples)
            self._median = costs[len(costs) // 2] if costs else 0.0
        return self._median

    @property
    def count(self) -> int:
        return len(self._samples)

    @property
    def goodput_tokens_per_ms(self) -> float:
        """Measured committed tokens per millisecond over the window (0 when empty)."""
        return self.tokens / self.interval_ms if self.interval_ms > 0 else 0.0

    @property
    def verified_per_request_step(self) -> float:
        """Tokens the target verified per request per step: 1 + the drafts it was given (level-free:
        what the machine's speed does not change)."""
        return self.verified / self.requests if self.requests else 0.0

    def verified_variance(self) -> float:
        """Variance over the window's samples of the tokens verified per request: 0 for a drafter that
        always fills its budget at a steady batch, more for one whose proposals come and go."""
        count = len(self._samples)
        if count < 2:
            return 0.0
        mean = self.verified_ratios / count
        return max(0.0, self.verified_squares / count - mean * mean)

    @property
    def ms_per_request_step(self) -> float:
        """Milliseconds per request per step: the arm's cost, comparable across batch sizes in a bucket."""
        return self.interval_ms / self.requests if self.requests else 0.0

    def relative_cost_variance(self) -> float | None:
        """Variance of the per-sample cost over its mean squared (None below two samples)."""
        count = len(self._samples)
        if count < 2:
            return None
        mean = self.cost_sum / count
        if mean <= 0.0:
            return None
        variance = max(0.0, self.cost_squares / count - mean * mean) * count / (count - 1)
        return variance / (mean * mean)

    @property
    def mean_batch(self) -> float:
        return self.requests / len(self._samples) if self._samples else 0.0
