"""AdaptiveController: the policy plus everything around it that is not vLLM-specific.

The scheduler (the only vLLM-facing piece) calls ``choose_gamma`` before each ``schedule()`` and
``observe_step`` after each ``update_from_output`` (under asynchronous scheduling, after the next
``choose_gamma``). This module keeps the bookkeeping that a policy should not care about: which K
produced the drafts being verified (drafts are made one step ahead), timing of non-overlapping step
intervals, the sticky K=0 cohort, the trace file, the /metrics snapshot and the shutdown summary.
Pure Python: unit-testable without vLLM.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any, Callable, Optional

from vspec_runtime import envs, metrics
from vspec_runtime.control import make_policy
from vspec_runtime.control.base import Decision, Policy, StepFeedback
from vspec_runtime.control.per_request import DraftAllocator
from vspec_runtime.control.rules import feasible_cap
from vspec_runtime.control.sticky import SkippedDrafts, StickyZero, skips_drafter
from vspec_runtime.control.switch import PolicySwitch
from vspec_runtime.spec import METHODS_WITH_DRAFTER, RuntimeSpec

logger = logging.getLogger("vspec.controller")

SNAPSHOT_EVERY_S = 1.0  # a snapshot costs about 1 ms (a file replaced); idle engines publish at once
BENCH_POLICY_FILE = "bench-policy"  # in VSPEC_RUN_DIR: the label a PolicySwitch runs next (interleaved bench)


@dataclass(frozen=True)
class ObservedStep:
    """One finished engine step, as the scheduler saw it."""

    drafted: tuple[int, ...]  # per request with drafts: draft tokens verified
    accepted: tuple[int, ...]  # per request with drafts: accepted draft tokens
    batch_size: int  # requests in the step
    pure_decode: bool  # nobody admitted or prefilling, nobody preempted
    scheduled_at: float  # clock time when this step's schedule() began
    completed_at: float  # clock time when its output was processed
    context_tokens: int = 0
    batched_tokens: int = 0
    request_ids: tuple[str, ...] = ()  # aligned with drafted / accepted
    batch_ids: tuple[str, ...] = ()  # every request in the step, drafting or not
    finished: tuple[str, ...] = ()  # requests that finished since the previous step
    # The K that made the drafts this step verified, and the K it asked the drafter for, as the
    # scheduler saw them at schedule(). None: inferred from the order of the controller's own calls,
    # which holds only when every step is observed before the next is chosen (synchronous scheduling).
    verified_gamma: Optional[int] = None
    drafting_gamma: Optional[int] = None


class FaultInjectingPolicy(Policy):
    """Test hook (VSPEC_FAULT_AFTER_STEPS): behaves like ``inner`` then raises, to prove isolation."""

    name = "fault-injector"

    def __init__(self, inner: Policy, fail_after: int):
        self.inner, self.fail_after, self.calls = inner, fail_after, 0

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        self.calls += 1
        if self.calls > self.fail_after:
            raise RuntimeError(f"injected policy fault after {self.fail_after} decisions")
        return self.inner.choose(batch_size, max_feasible_gamma)

    def observe(self, feedback: StepFeedback) -> None:
        self.inner.observe(feedback)

    def decide_next(self, batch_size: int) -> None:
        self.inner.decide_next(batch_size)

    def summary(self) -> dict[str, Any]:
        return self.inner.summary()


def load_profile(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class AdaptiveController:
    def __init__(
        self,
        spec: RuntimeSpec,
        max_gamma: int,
        max_batched_tokens: int,
        policy: Optional[Policy] = None,
        clock: Callable[[], float] = time.perf_counter,
        ranks: Optional[dict[str, Any]] = None,
        prefix_caching: bool = True,
    ):
        self.spec = spec
        self.ranks = ranks or {}  # vspec_runtime/parallel.py rank_layout: which ranks this controller serves
        self.max_gamma = max_gamma
        self.max_batched_tokens = max_batched_tokens
        self.clock = clock
        self.policy = policy or self._build_policy()
        self._idle = True  # no request in flight: the interleaved bench may switch policies now
        self.sticky_zero = spec.method in METHODS_WITH_DRAFTER and spec.adaptive.gamma0_mode == "sticky"
        self._zero_cohort = StickyZero(spec.adaptive.gamma0_reprobe_steps)
        self._skipped_drafts = SkippedDrafts()  # requests the cohort's skipped drafter left unable to draft
        # Without prefix caching the K=0 fast path skips the drafter in prompt steps too (sticky.skips_drafter).
        self._prefix_caching = prefix_caching
        self.current_gamma = min(max_gamma, spec.adaptive.fixed_gamma or max_gamma)
        self._drafted_with: Optional[int] = None  # K that produced the drafts verified next step
        self._last_completed_at: Optional[float] = None
        self._last_decision: Optional[Decision] = None
        self._last_reward: Optional[float] = None
        self.steps = 0
        self.switches = 0
        self.selections: Counter[int] = Counter()
        self.confidence_cut_requests = 0  # request-steps whose draft confidence stop cut
        self.confidence_dropped_drafts = 0  # drafts those cuts removed before verification
        self._trace: Optional[IO[str]] = self._open_trace(spec.adaptive.trace)
        self._samples: Optional[IO[str]] = self._open_trace(spec.adaptive.samples)
        # Context lengths cost a pass over the batch: only gathered when a consumer needs them.
        self.wants_context = spec.adaptive.samples is not None or spec.adaptive.policy == "profile"
        self._last_snapshot = 0.0
        # Per-request draft lengths: on for the spec, or (interleaved bench) for the labels that ask.
        self._per_request_labels = self._labels_with_per_request()
        self.allocator: Optional[DraftAllocator] = (
            DraftAllocator(max_gamma) if spec.adaptive.per_request or self._per_request_labels else None)

    # --- construction -------------------------------------------------------------------------

    def _build_policy(self) -> Policy:
        labelled = envs.get("VSPEC_BENCH_POLICIES")
        if labelled:
            return self._build_switch(json.loads(labelled))
        policy = self._make_one(self.spec.adaptive, self.max_gamma)
        fail_after = envs.get("VSPEC_FAULT_AFTER_STEPS")
        if fail_after is not None:
            # Inside the guard, exactly where a real policy bug would surface.
            policy.inner = FaultInjectingPolicy(policy.inner, int(fail_after))
        return policy

    def _make_one(self, adaptive, max_gamma: int) -> Policy:
        profile = load_profile(adaptive.profile) if adaptive.policy == "profile" else None
        return make_policy(adaptive, max_gamma, profile=profile, method=self.spec.method)

    def _build_switch(self, labelled: dict[str, Any]) -> PolicySwitch:
        """One policy per label, each with its own settings and its own max K (<= the engine's)."""
        from vspec_runtime.spec import AdaptiveSettings

        policies = {
            label: self._make_one(AdaptiveSettings.model_validate(entry["adaptive"]),
                                  min(self.max_gamma, int(entry.get("gamma", self.max_gamma))))
            for label, entry in labelled.items()
        }
        logger.info("vspec: interleaved bench, one engine switching between %s", ", ".join(policies))
        return PolicySwitch(policies, active=next(iter(policies)))

    @staticmethod
    def _labels_with_per_request() -> frozenset[str]:
        labelled = envs.get("VSPEC_BENCH_POLICIES")
        if not labelled:
            return frozenset()
        return frozenset(label for label, entry in json.loads(labelled).items()
                         if entry.get("adaptive", {}).get("per_request"))

    def _per_request_active(self) -> bool:
        if self.allocator is None:
            return False
        if isinstance(self.policy, PolicySwitch):
            return self.policy.active in self._per_request_labels
        return True

    def _select_bench_policy(self) -> None:
        """Between rounds of the interleaved bench: run the label the driver wrote last."""
        run_dir = envs.get("VSPEC_RUN_DIR")
        if not run_dir:
            return
        try:
            with open(f"{run_dir}/{BENCH_POLICY_FILE}", encoding="utf-8") as handle:
                label = handle.read().strip()
        except FileNotFoundError:
            return
        if label and not self.policy.select(label):
            logger.warning("vspec: interleaved bench asked for unknown policy %r; keeping %r", label, self.policy.active)

    @staticmethod
    def _open_trace(path: Optional[str]) -> Optional[IO[str]]:
        if not path:
            return None
        return open(path, "a", buffering=1, encoding="utf-8")  # line-buffered: readable while serving

    # --- the two calls the scheduler makes ------------------------------------------------------

    def max_feasible_gamma(self, batch_size: int) -> int:
        """Largest K with B*(K+1) <= max_num_batched_tokens."""
        if batch_size <= 0:
            return self.max_gamma
        return feasible_cap(self.max_batched_tokens // batch_size - 1, self.max_gamma)

    def choose_gamma(self, batch_size: int) -> int:
        """K the drafter produces at the end of the coming step."""
        if batch_size <= 0:
            self._cohort_drained()
            return self.current_gamma
        if self._idle:
            self._idle = False
            self._cohort_drained()  # every request of the cohort finished: speculation may resume
            if isinstance(self.policy, PolicySwitch):
                self._select_bench_policy()
        if self._zero_cohort.holds():
            decision = Decision(0, "sticky-zero", rewards={})
        else:
            if self._zero_cohort.decision_due():
                self.policy.decide_next(batch_size)  # not asked while K=0 was held: look now, don't hold
            decision = self.policy.choose(batch_size, self.max_feasible_gamma(batch_size))
            if self.sticky_zero:
                self._zero_cohort.chose(decision.gamma)
        self._record_decision(decision, batch_size)
        return decision.gamma

    def observe_step(self, step: ObservedStep, idle_after: bool = False) -> None:
        """``idle_after``: no request is left, so publish now (no later step would)."""
        verified_gamma, drafting_gamma = self._gammas_of(step)
        interval_start = step.scheduled_at
        if self._last_completed_at is not None:
            interval_start = max(interval_start, self._last_completed_at)
        interval_ms = max((step.completed_at - interval_start) * 1000.0, 1e-6)
        self._last_completed_at = step.completed_at
        # Stable: a pure decode step whose verified drafts and new drafts used the same K, so the
        # interval's cost and its committed tokens both belong to that K.
        stable = step.pure_decode and verified_gamma == drafting_gamma
        cannot_draft = self._skipped_drafts.in_step(step.batch_ids, step.request_ids)
        if self.sticky_zero:
            # drafting_gamma is the K this step drafted with: at 0 the fast path skipped the drafter,
            # in pure decode steps, and with prefix caching off in every step.
            skippable = skips_drafter(step.pure_decode, self._prefix_caching)
            self._skipped_drafts.after_step(step.batch_ids, step.finished, drafting_gamma, skippable)
        feedback = StepFeedback(
            batch_size=step.batch_size,
            gamma=verified_gamma,
            drafted=step.drafted,
            accepted=step.accepted,
            interval_ms=interval_ms,
            stable=stable,
            context_tokens=step.context_tokens,
            batched_tokens=step.batched_tokens,
            request_ids=step.request_ids,
            batch_ids=step.batch_ids,
            cannot_draft=cannot_draft,
        )
        self._drafted_with = drafting_gamma
        if self._samples is not None and step.batch_size > 0:
            self._write_sample(feedback, step.request_ids, step.completed_at)
        if self.allocator is not None:
            self.allocator.observe_step(step.request_ids, step.drafted, step.accepted, step.batched_tokens,
                                        interval_ms, step.pure_decode)
            self.allocator.finished(step.finished)
        if step.batch_size > 0:
            self.policy.observe(feedback)
            if stable:
                self._last_reward = feedback.committed_tokens / interval_ms
        if idle_after:
            self._idle = True
        self._maybe_publish(force=idle_after)

    def _cohort_drained(self) -> None:
        self._zero_cohort.drained()
        self._skipped_drafts.clear()  # nobody is left: every skipped request finished

    def _gammas_of(self, step: ObservedStep) -> tuple[int, int]:
        """(K that made the verified drafts, K drafted with at the end of the step).

        Under asynchronous scheduling the next step is chosen before this one is observed, so the
        current K already belongs to the next step; the scheduler then says which K were used."""
        drafting = step.drafting_gamma if step.drafting_gamma is not None else self.current_gamma
        if step.verified_gamma is not None:
            return step.verified_gamma, drafting
        return (self._drafted_with if self._drafted_with is not None else self.current_gamma), drafting

    def draft_lengths(self, offered: dict[str, int], caps: dict[str, int]) -> Optional[dict[str, int]]:
        """Drafts each request keeps for verification (per-request lengths and client caps), or None
        to keep every draft as made."""
        if self._per_request_active():
            return self.allocator.lengths(offered, caps)
        if caps:
            return {rid: min(count, caps[rid]) for rid, count in offered.items() if rid in caps}
        return None

    def observe_confidence_cuts(self, gamma: int, kept: dict[str, int]) -> None:
        """Confidence stop cut these requests' drafts (request id -> drafts kept of ``gamma``)."""
        if not kept:
            return
        dropped = sum(gamma - length for length in kept.values())
        self.confidence_cut_requests += len(kept)
        self.confidence_dropped_drafts += dropped
        if self._trace is not None:
            line = {"step": self.steps, "time": round(self.clock(), 6), "event": "confidence-stop",
                    "gamma": gamma, "kept": kept, "dropped": dropped}
            self._trace.write(json.dumps(line) + "\n")

    # --- bookkeeping ----------------------------------------------------------------------------

    def _record_decision(self, decision: Decision, batch_size: int) -> None:
        self.steps += 1
        if decision.gamma != self.current_gamma:
            self.switches += 1
        changed = decision.gamma != self.current_gamma
        self.current_gamma = decision.gamma
        self.selections[decision.gamma] += 1
        self._last_decision = decision
        if self._trace is not None and (changed or decision.reason != "hold"):
            self._write_trace(decision, batch_size)

    def _write_trace(self, decision: Decision, batch_size: int) -> None:
        summary = self.policy.summary()
        line = {
            "step": self.steps,
            "time": round(self.clock(), 6),
            "batch_size": batch_size,
            "bucket": decision.bucket,
            "gamma": decision.gamma,
            "reason": decision.reason,
            "reward": self._last_reward,
            "rewards": {str(k): v for k, v in decision.rewards.items()},
            "acceptance": summary.get("acceptance"),
        }
        if "active" in summary:
            line["policy"] = summary["active"]
        bucket_state = (summary.get("buckets") or {}).get(str(decision.bucket))
        if bucket_state is not None:
            line["bucket_state"] = bucket_state  # the arms and cost line this decision read
        if self.ranks:
            line["ranks"] = self.ranks
        if self._per_request_active() and self.allocator.last:
            line["drafts_kept"] = self.allocator.last  # the previous step's verification budget
        self._trace.write(json.dumps(line) + "\n")

    def _write_sample(self, feedback: StepFeedback, request_ids: tuple[str, ...], completed_at: float) -> None:
        """One profiling sample per verified step (vspec profile collect reads these). ``time`` is when
        the step's output was processed, on the clock the bench's loads are timed with (perf_counter,
        shared by the processes of one machine), so a bench's samples can be cut by round."""
        line = {
            "time": round(completed_at, 6),
            "batch_size": feedback.batch_size,
            "gamma": feedback.gamma,
            "stable": feedback.stable,
            "interval_ms": round(feedback.interval_ms, 4),
            "drafted": sum(feedback.drafted),
            "accepted": sum(feedback.accepted),
            "accepted_per_request": list(feedback.accepted),
            "drafted_per_request": list(feedback.drafted),
            "committed": feedback.committed_tokens,
            "context_tokens": feedback.context_tokens,
            "batched_tokens": feedback.batched_tokens,
            "request_ids": list(request_ids),
        }
        active = getattr(self.policy, "active", None)
        if active is not None:
            line["policy"] = active  # a bench engine's label for the policy this step ran under
        self._samples.write(json.dumps(line) + "\n")

    def snapshot(self) -> dict[str, Any]:
        decision = self._last_decision
        return {
            "method": self.spec.method,
            "policy": self.spec.adaptive.policy,
            "gamma": self.current_gamma,
            "max_gamma": self.max_gamma,
            "steps": self.steps,
            "switches": self.switches,
            "selections": {str(k): v for k, v in sorted(self.selections.items())},
            "rewards": {str(k): v for k, v in (decision.rewards if decision else {}).items()},
            "faulted": bool(getattr(self.policy, "faulted", False)),
            "relaxed": self.spec.relaxed.enabled,
            "confidence_cut_requests": self.confidence_cut_requests,
            "confidence_dropped_drafts": self.confidence_dropped_drafts,
            **({"per_request": self.allocator.summary()} if self.allocator is not None else {}),
            **({"active_policy": self.policy.active} if isinstance(self.policy, PolicySwitch) else {}),
            **({"ranks": self.ranks} if self.ranks else {}),
        }

    def _maybe_publish(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self._last_snapshot >= SNAPSHOT_EVERY_S:
            self._last_snapshot = now
            metrics.publish(self.snapshot())

    def summary(self) -> dict[str, Any]:
        total = sum(self.selections.values()) or 1
        policy_summary = self.policy.summaries() if isinstance(self.policy, PolicySwitch) else self.policy.summary()
        return {
            **self.snapshot(),
            "mean_gamma": round(sum(k * n for k, n in self.selections.items()) / total, 3),
            "policy_summary": policy_summary,
        }

    def close(self) -> dict[str, Any]:
        summary = self.summary()
        self._maybe_publish(force=True)
        for handle in (self._trace, self._samples):
            if handle is not None:
                handle.close()
        self._trace = self._samples = None
        return summary
