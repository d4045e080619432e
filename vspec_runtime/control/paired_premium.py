"""K=0's price relative to the drafting steps beside it, read only where the two ran back to back.

``token_costs`` prices every K>0 arm with a line of step cost against verified tokens, fitted on the
latest drafting steps, so those arms are priced at the machine's speed of the latest drafting step.
K=0 is off the line (a step that drafts pays for drafting whatever it verifies) and kept its own
window, measured whenever the policy last ran K=0: on a machine whose speed wanders by 10% over a
minute, a 3-4% gap between K=0 and K=1 (open chat at batch 8) was decided by which of the two had
last run in a slow spell.

Here K=0's cost is a premium over the line: each step's cost over what the line predicted for its
verified tokens at that moment (K=0 verifies one token a request). The premium of K=0 over the
drafting steps is read only at a switch between the two, from the last steps before it and the
first steps after it, which ran within a few steps of each other at (almost) the same machine speed.
The machine's level cancels in the ratio; what remains is the step noise and the drift over a few
steps. K=0's cost is then the premium times the line, at the line's level, like every K>0 arm.
"""

from __future__ import annotations

import math
from collections import deque


SIDE_STEPS = 8  # steps read on each side of a switch
MIN_SIDE_STEPS = 3  # a side cut shorter than this by the next switch gives no pair
KEPT_PAIRS = 12  # the premium's memory, in switches


class PairedPremium:
    """Log-ratios of K=0's residual cost to the drafting steps' residual, one per switch between them."""

    def __init__(self) -> None:
        self._before: deque[float] = deque(maxlen=SIDE_STEPS)  # residuals of the running side
        self._running_zero: bool | None = None
        self._after: list[float] = []
        self._pending: tuple[bool, list[float]] | None = None  # (the side before was K=0, its residuals)
        self.log_ratios: deque[float] = deque(maxlen=KEPT_PAIRS)

    def observe(self, zero: bool, residual: float) -> None:
        """One cost sample: ``residual`` = the step's cost / the line's prediction for its tokens."""
        if not (math.isfinite(residual) and residual > 0.0):
            return
        if self._running_zero is not None and zero != self._running_zero:
            self._close_pending()
            if len(self._before) >= MIN_SIDE_STEPS:
                self._pending = (self._running_zero, list(self._before))
            self._before.clear()
        self._running_zero = zero
        self._before.append(residual)
        if self._pending is not None:
            self._after.append(residual)
            if len(self._after) >= SIDE_STEPS:
                self._close_pending()

    def _close_pending(self) -> None:
        pending, after = self._pending, self._after
        self._pending, self._after = None, []
        if pending is None or len(after) < MIN_SIDE_STEPS:
            return
        before_zero, before = pending
        zero_side, drafting_side = (before, after) if before_zero else (after, before)
        self.log_ratios.append(math.log(_mean(zero_side) / _mean(drafting_side)))

    def premium(self, min_pairs: int = 2) -> float | None:
        """K=0's cost over the line's prediction at one token, or None on fewer than ``min_pairs`` switches."""
        if len(self.log_ratios) < min_pairs:
            return None
        return math.exp(sum(self.log_ratios) / len(self.log_ratios))

    def clear(self) -> None:
        self.__init__()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
