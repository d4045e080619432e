"""StickyZero: a model drafter's K=0 held for a cohort of requests, re-probed under continuous load;
SkippedDrafts: the requests that cannot draft since, as the engine keeps them.

Why hold K=0: with a model drafter, K=0 saves the most when the drafter does not run at all (the K=0
fast path, vspec_runtime/patches/k0_fast_path.py, skips it inside a cohort), and a request whose
drafter cache was skipped cannot draft well again. So once the policy picks K=0 the controller holds
it without asking the policy until every request of the cohort has finished (the engine went idle).

Why re-probe: a server under continuous load never goes idle, and a K=0 chosen in a bad minute would
hold forever. After ``reprobe_steps`` held steps the policy is asked again (the controller makes it
decide then, not hold where its last decision left it). A probe fails when the policy keeps K=0, or
picks K>0 and comes back to 0 within ``reprobe_steps`` steps (what a probe looks like under load: a
few steps of drafting until the acceptance model has seen enough); each failure doubles the next
hold (up to ``MAX_BACKOFF`` times), so probing costs a bounded and shrinking share of steps while
speculation keeps losing. K>0 kept for ``reprobe_steps`` steps resets the hold. Requests whose
drafter cache fell behind during the cohort draft nothing when K comes back (the fast path trims
their drafts); requests admitted since draft normally. ``reprobe_steps = 0`` holds until idle.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_BACKOFF = 16


def skips_drafter(pure_decode: bool, prefix_caching: bool) -> bool:
    """Whether a K=0 step of a sticky cohort skips a model drafter: the rule the K=0 fast path applies
    in the worker (patches/k0_fast_path.py) and ``SkippedDrafts`` mirrors in the scheduler.

    Every request of such a step was running or admitted in the cohort and never drafts again, so the
    drafter's cache for it is never read by itself. A step with prompt tokens is the exception when
    prefix caching is on: its prompt blocks go into the cache, a later request that drafts may reuse
    them, and they must then hold the drafter's values. With prefix caching off nobody reuses them, and
    on the demo's chat at batch 8 the drafter's prompt pass was most of what K=0 cost."""
    return pure_decode or not prefix_caching


class StickyZero:
    def __init__(self, reprobe_steps: int) -> None:
        self.reprobe_steps = reprobe_steps
        self.active = False  # inside a cohort: K=0 without asking the policy
        self._held = 0  # steps held in this cohort since it (re)started
        self._backoff = 1  # the hold is reprobe_steps * backoff steps
        self._speculating: int | None = None  # steps of K>0 since a probe ended a cohort; None: no probe on
        self._drained_while_held = False  # the next step after a drained cohort is a decision

    def holds(self) -> bool:
        """Whether this step's K is the cohort's 0 (the policy is not asked); counts the held step."""
        if not self.active:
            return False
        if self.probe_due():
            return False  # probe: the policy decides this step; chose() says what follows
        self._held += 1
        return True

    def probe_due(self) -> bool:
        """Inside a cohort whose hold is over: the policy must decide this step."""
        return self.active and bool(self.reprobe_steps) and self._held >= self.reprobe_steps * self._backoff

    def decision_due(self) -> bool:
        """The policy must decide this step, not "hold": a probe is due, or a K=0 cohort just drained.
        The policy was not asked while K=0 was held, so its hold countdown is where its K=0 decision
        left it; a "hold" now would keep K=0 (and latch the next cohort) with nobody having looked."""
        due = self.probe_due() or self._drained_while_held
        self._drained_while_held = False
        return due

    def chose(self, gamma: int) -> None:
        """The policy's decision for a step outside a hold."""
        if gamma > 0:
            self._speculated()
        elif self.active:  # a probe that kept K=0: hold twice as long before the next one
            self._held, self._backoff = 0, self._doubled()
        else:
            probe_failed = self._speculating is not None
            self.active, self._held, self._speculating = True, 0, None
            if probe_failed:
                self._backoff = self._doubled()

    def drained(self) -> None:
        """Every request of the cohort finished: the next batch starts afresh, with a decision."""
        self._drained_while_held = self._drained_while_held or self.active
        self.active, self._held, self._backoff, self._speculating = False, 0, 1, None

    def _speculated(self) -> None:
        if self.active:  # a probe picked K>0: the cohort ends, the probe runs while K stays above 0
            self.active, self._held, self._speculating = False, 0, 0
        elif self._speculating is not None:
            self._speculating += 1
            if self._speculating >= self.reprobe_steps:  # K>0 held on: the probe succeeded
                self._speculating, self._backoff = None, 1

    def _doubled(self) -> int:
        return min(self._backoff * 2, MAX_BACKOFF)


class SkippedDrafts:
    """The requests whose drafter a K=0 decode step skipped: they draft nothing until they finish.

    The same rule as the K=0 fast path in the worker (patches/k0_fast_path.py), kept here from what
    the scheduler sees, because the policy must know which empty drafts mean "this request cannot
    draft" rather than "the budget K was not filled": counted as failures, as acceptance counts an
    unfilled budget, they made every re-probe under continuous load read an acceptance near 0 (the
    whole batch had run through the cohort) and return to K=0 for good, whatever the drafter could
    do for the requests arriving since.
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def in_step(self, batch_ids: Iterable[str], drafting_ids: Iterable[str]) -> tuple[str, ...]:
        """The requests of a step that could not draft; a request that drafted after all (preempted and
        recomputed, so the worker forgot it) is forgotten here too."""
        if not self._ids:
            return ()
        self._ids.difference_update(drafting_ids)
        return tuple(request for request in batch_ids if request in self._ids)

    def after_step(self, batch_ids: Iterable[str], finished: Iterable[str], gamma: int, skippable: bool) -> None:
        """A step at K=0 of a kind the fast path skips (``skippable``: pure decode, or any step with
        prefix caching off) skipped the drafter for its whole batch; finished requests leave."""
        if finished and self._ids:
            self._ids.difference_update(finished)
        if gamma == 0 and skippable:
            self._ids.update(batch_ids)

    def clear(self) -> None:
        self._ids.clear()
