"""StickyZero: a model drafter's K=0 held for a cohort of requests, re-probed under continuous load.

Why hold K=0: with a model drafter, K=0 saves the most when the drafter does not run at all (the K=0
fast path, vspec_runtime/patches/k0_fast_path.py, skips it inside a cohort), and a request whose
drafter cache was skipped cannot draft well again. So once the policy picks K=0 the controller holds
it without asking the policy until every request of the cohort has finished (the engine went idle).

Why re-probe: a server under continuous load never goes idle, and a K=0 chosen in a bad minute would
hold forever. After ``reprobe_steps`` held steps the policy is asked again; if it keeps K=0 the next
hold is twice as long (up to ``MAX_BACKOFF`` times), so probing costs a bounded share of steps when
speculation keeps losing, and a policy that picks K>0 ends the cohort at once. Requests whose drafter
cache fell behind during the cohort draft nothing when K comes back (the fast path trims their
drafts); requests admitted since draft normally. ``reprobe_steps = 0`` holds until idle, as before.
"""

from __future__ import annotations

MAX_BACKOFF = 16


class StickyZero:
    def __init__(self, reprobe_steps: int) -> None:
        self.reprobe_steps = reprobe_steps
        self.active = False  # inside a cohort: K=0 without asking the policy
        self._held = 0  # steps held in this cohort since it (re)started
        self._backoff = 1  # the hold is reprobe_steps * backoff steps

    def holds(self) -> bool:
        """Whether this step's K is the cohort's 0 (the policy is not asked); counts the held step."""
        if not self.active:
            return False
        if self.reprobe_steps and self._held >= self.reprobe_steps * self._backoff:
            return False  # probe: the policy decides this step; chose() says what follows
        self._held += 1
        return True

    def chose(self, gamma: int) -> None:
        """The policy's decision for a step outside a hold."""
        if gamma > 0:
            self.active, self._held, self._backoff = False, 0, 1
        elif self.active:  # a probe that kept K=0: hold twice as long before the next one
            self._held, self._backoff = 0, min(self._backoff * 2, MAX_BACKOFF)
        else:
            self.active, self._held = True, 0

    def drained(self) -> None:
        """Every request of the cohort finished: the next batch starts afresh."""
        self.active, self._held, self._backoff = False, 0, 1
