"""AdaptiveScheduler: vLLM's scheduler with K chosen by vspec's controller every step.

Passed to vLLM as ``--scheduler-cls vspec_runtime.scheduler.AdaptiveScheduler`` (a supported
extension point, config/scheduler.py). It relies on vLLM's "dynamic SD" plumbing: when
``num_speculative_tokens_per_batch_size`` is configured, ``Scheduler.schedule()`` reads K from the
dense list ``self.dynamic_sd_lookup`` (indexed by batch size) into
``SchedulerOutput.num_spec_tokens_to_schedule``, and the model runner drafts that many tokens.
We rewrite that list before each ``schedule()`` and read the verified counts after each
``update_from_output()``. What it reads from vLLM's step objects is read in
vspec_runtime/vllm_adapter.py; every vLLM member used here or there is listed in
vspec_runtime/vllm_surface.py (needed for "adaptive"), checked by `vspec doctor` and once per process
when this scheduler starts: a renamed member stops the engine at start-up, naming it, rather than
leaving K frozen without a word.

Synchronous or asynchronous scheduling. vLLM 0.32 resolves ``scheduler_config.async_scheduling``
(on by default on CUDA for EAGLE and draft models, always off on CPU) and, with it on, overlaps
scheduling step N+1 with running step N. Its ``AsyncScheduler`` then gives every decoding request
-1 placeholders, as many as step N's ``num_spec_tokens_to_schedule``; the model runner puts its own
drafts in their place and never hands them to the scheduler (``update_draft_token_ids`` is not
called). ``--scheduler-cls`` names one class whatever vLLM resolved, so ``AdaptiveScheduler.__new__``
builds ``AsyncAdaptiveScheduler`` when the resolved config is asynchronous. Both carry the same
hooks (``AdaptiveHooks``); under async, K still reaches the drafter (it sizes the placeholders) and
the verified counts are read the same way, but the features that act on the drafts inside the
scheduler (per-request lengths, client caps, confidence-cut counts) cannot, and say so once.

Fault isolation: any exception in vspec's code here is logged once with its traceback, K is frozen
at a safe value and vLLM keeps serving as with a fixed K.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vspec_runtime import parallel, vllm_adapter, vllm_surface
from vspec_runtime.activation import active_spec
from vspec_runtime.control.rules import clamp_gamma
from vspec_runtime.controller import AdaptiveController
from vspec_runtime.patches._base import IncompatibleVllm

logger = logging.getLogger("vspec.scheduler")

_surface_ok = False  # set once the start-up check passed: vLLM cannot change under a running process
SYNC_SCHEDULING_FLAG = "--no-async-scheduling"


def check_vllm_surface() -> None:
    """Raise IncompatibleVllm naming every "adaptive" SURFACE member the installed vLLM lacks.

    Without this, a renamed field would raise inside the guarded per-step code, which freezes K and
    serves on: correct output, but the controller silently off. Checked once per process."""
    global _surface_ok
    if _surface_ok:
        return
    missing = [(sym, reason) for sym in vllm_surface.SURFACE
               if "adaptive" in sym.needed_for and (reason := vllm_surface.problem(sym)) is not None]
    if missing:
        from vspec_runtime import SUPPORTED_VLLM

        details = "; ".join(f"{sym.name}: {reason}" for sym, reason in missing)
        raise IncompatibleVllm(
            f"vspec's adaptive scheduler cannot run on this vLLM ({details}). vspec supports vLLM "
            f"{SUPPORTED_VLLM}; run `vspec doctor --adaptive` for the full list, or serve without adaptive K."
        )
    _surface_ok = True


def schedules_async(vllm_config: Any) -> bool:
    """Whether vLLM resolved asynchronous scheduling for this engine (None: no config, synchronous)."""
    if vllm_config is None:
        return False
    scheduler_config = vllm_config.scheduler_config
    return bool(scheduler_config.async_scheduling)


@dataclass(frozen=True)
class _ScheduledStep:
    """What vspec remembers of a step between its schedule() and its update_from_output()."""

    started: float  # when schedule() began
    verified_gamma: int  # K that made the drafts this step verifies: the previous step's drafting K
    drafting_gamma: int  # K the drafter is asked for at the end of this step


class AdaptiveHooks:
    """vspec's hooks, shared by the synchronous and the asynchronous scheduler (each calls super())."""

    # Whether a step's drafts come back through update_draft_token_ids before the next step is
    # scheduled (synchronous) or stay in the model runner (asynchronous).
    _vspec_drafts_via_scheduler = True
    _vspec_clock = staticmethod(time.perf_counter)  # what step intervals are measured with (tests set a fake)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vspec: Optional[AdaptiveController] = None
        self._vspec_faulted = False
        # Steps scheduled and not yet processed: one under sync, two in flight under async.
        self._vspec_in_flight: deque[tuple[int, _ScheduledStep]] = deque(maxlen=8)
        self._vspec_drafting_k = 0  # K the drafter was asked for in the last step that ran requests
        self._vspec_output_at: Optional[float] = None  # when the last step's output was processed
        # Set by a draft hand-over (sync only): the next step's interval starts where that output was processed.
        self._vspec_interval_from: Optional[float] = None
        self._vspec_cap_warned = False
        spec = active_spec()
        self._vspec_counts_cuts = bool(spec is not None and spec.adaptive.entropy_stop)
        if spec is None or not spec.adaptive_active:
            logger.warning("vspec scheduler loaded without an adaptive vspec spec: behaving like vLLM's %s",
                           self._vllm_base_name())
            return
        check_vllm_surface()  # before the first read of a listed member below
        if self.dynamic_sd_lookup is None or self.num_spec_tokens <= 0:
            logger.warning(
                "vspec: vLLM's per-step K is off (no num_speculative_tokens_per_batch_size in the "
                "speculative config); the controller stays idle. `vspec serve` sets it for you."
            )
            return
        self._vspec = AdaptiveController(
            spec,
            max_gamma=self.num_spec_tokens,
            max_batched_tokens=self.max_num_scheduled_tokens,
            ranks=parallel.rank_layout(self.vllm_config),
            prefix_caching=self.cache_config.enable_prefix_caching,
        )
        self._set_gamma(self._vspec.current_gamma)
        self._vspec_drafting_k = self._vspec.current_gamma
        logger.info(
            "vspec adaptive scheduler on vLLM's %s: policy=%s K in [%d, %d], max_num_batched_tokens=%d",
            self._vllm_base_name(), spec.adaptive.policy, spec.adaptive.min_gamma, self.num_spec_tokens,
            self.max_num_scheduled_tokens,
        )
        if not self._vspec_drafts_via_scheduler:
            self._warn_what_async_disables(spec)

    def _vllm_base_name(self) -> str:
        return "Scheduler" if self._vspec_drafts_via_scheduler else "AsyncScheduler"

    def _warn_what_async_disables(self, spec) -> None:
        """One warning listing the configured features that need the drafts to pass through here."""
        inert = []
        if self._vspec.allocator is not None:
            inert.append("per-request draft lengths (adaptive.per_request)")
        if spec.adaptive.entropy_stop:
            inert.append("confidence stop (adaptive.entropy_stop)")
        if inert:
            logger.warning(
                "vspec: vLLM schedules asynchronously, so the drafts go from the model runner to the next "
                "step without passing through the scheduler: %s have no effect. Serve with %s to use them.",
                " and ".join(inert), SYNC_SCHEDULING_FLAG,
            )

    # --- hooks ----------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        started = self._vspec_clock()
        if self._vspec_interval_from is not None:
            started, self._vspec_interval_from = self._vspec_interval_from, None
        if self._vspec is not None:
            self._guarded(self._choose_before_schedule)
        output = super().schedule(*args, **kwargs)
        if self._vspec is not None:
            self._guarded(lambda: self._remember_scheduled(output, started))
        return output

    def update_from_output(self, scheduler_output, model_runner_output):  # type: ignore[override]
        verified = None
        if self._vspec is not None:
            # Read first: vLLM trims sampled tokens at a stop and frees finished requests as it goes.
            verified = self._guarded(
                lambda: vllm_adapter.verified_drafts(scheduler_output, model_runner_output, self.requests))
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self._vspec is not None and verified is not None:
            completed = self._vspec_output_at = self._vspec_clock()
            self._guarded(lambda: self._observe(scheduler_output, model_runner_output, completed, verified))
        return result

    def add_request(self, request) -> None:  # type: ignore[override]
        if self._vspec is not None and not self._vspec_drafts_via_scheduler and not self._vspec_cap_warned:
            self._guarded(lambda: self._warn_if_capped(request))
        super().add_request(request)

    def _warn_if_capped(self, request) -> None:
        """A client cap is applied to the drafts in update_draft_token_ids, which async never calls."""
        cap = vllm_adapter.draft_cap_of(request)
        if cap is not None:
            self._vspec_cap_warned = True
            logger.warning(
                "vspec: a request asks for at most %d drafts (vllm_xargs %s), but vLLM schedules "
                "asynchronously and its drafts never pass through the scheduler: the cap has no effect. "
                "Serve with %s to honour caps.", cap, vllm_adapter.MAX_DRAFT_ARG, SYNC_SCHEDULING_FLAG,
            )

    # --- confidence stop: count per-request cuts (the cut itself happens in the worker) ----------

    def update_draft_token_ids(self, draft_token_ids):  # type: ignore[override]
        """The drafts made for the next step, before vLLM stores them on the requests (synchronous
        scheduling only: under async the model runner keeps them).

        Confidence stop: the worker-side patch (vspec_runtime/patches/gpu_model_runner.py) already
        trimmed each request's drafts; a list shorter than the K asked for is a confidence cut,
        counted here because the trace lives in this process. Then per-request lengths and client
        caps trim the lists in place (lossless: a shorter draft verifies the kept tokens the same)."""
        if self._vspec is not None and self.running:
            # The engine core fetched these drafts from the worker after the step's output was processed
            # (a round trip, skipped after K=0 steps by k0-draft-handover): a cost of drafting, so the
            # next step's measured interval includes it. Not when nothing runs: the next step then
            # waits for a request, and that wait is no step's cost.
            self._vspec_interval_from = self._vspec_output_at
        if self._vspec is not None and self._vspec_counts_cuts:
            self._guarded(lambda: self._count_confidence_cuts(draft_token_ids))
        if self._vspec is not None:
            self._guarded(lambda: self._trim_drafts(draft_token_ids))
        super().update_draft_token_ids(draft_token_ids)

    def _trim_drafts(self, draft_token_ids) -> None:
        offered, caps = vllm_adapter.offered_drafts(draft_token_ids, self.requests)
        if offered:
            lengths = self._vspec.draft_lengths(offered, caps)
            if lengths:
                vllm_adapter.trim_drafts(draft_token_ids, lengths)

    def _count_confidence_cuts(self, draft_token_ids) -> None:
        asked = self._vspec_drafting_k
        self._vspec.observe_confidence_cuts(asked, vllm_adapter.confidence_cuts(draft_token_ids, self.requests, asked))

    def shutdown(self) -> None:
        if self._vspec is not None:
            try:
                summary = self._vspec.close()
                logger.info("vspec summary: %s", summary)
            except Exception:  # noqa: BLE001 - shutdown must finish whatever happened
                logger.exception("vspec: failed to write the shutdown summary")
        super().shutdown()

    # --- vspec logic ----------------------------------------------------------------------------

    def _choose_before_schedule(self) -> None:
        batch_estimate = vllm_adapter.drafting_batch_size(self)
        self._set_gamma(self._vspec.choose_gamma(batch_estimate))

    def vspec_drafts_pending(self) -> bool:
        """Whether the step that just ran may have left drafts in the model runner.

        False when vspec scheduled it with K=0: the drafter was asked for no tokens, so the engine
        core's hand-over (a round trip to the worker, ``EngineCore.post_step``) would bring back empty
        lists; the ``k0-draft-handover`` patch skips it then. True whenever vspec is not steering K
        (no controller, or a faulted one), so vLLM's hand-over runs as shipped."""
        return self._vspec is None or self._vspec_drafting_k > 0

    def _set_gamma(self, gamma: int) -> None:
        lookup = self.dynamic_sd_lookup
        gamma = clamp_gamma(gamma, 0, self.num_spec_tokens)
        if lookup is not None and lookup[-1] != gamma:
            lookup[1:] = [gamma] * (len(lookup) - 1)  # index 0 unused; every batch size gets K

    def _remember_scheduled(self, output, started: float) -> None:
        """Which K made the drafts this step verifies, and which K it drafts with.

        Steps run in the order they are scheduled, in both modes, so the drafts a step verifies were
        made at the end of the previous step that ran requests. Under async that step's output is not
        processed yet when this one is scheduled, so the controller cannot infer the K from the order
        of its own calls; it is told."""
        drafting = output.num_spec_tokens_to_schedule
        self._vspec_in_flight.append((id(output), _ScheduledStep(started, self._vspec_drafting_k, drafting)))
        if output.num_scheduled_tokens:  # a step without requests drafts nothing
            self._vspec_drafting_k = drafting

    def _take_scheduled(self, scheduler_output) -> Optional[_ScheduledStep]:
        for index, (output_id, scheduled) in enumerate(self._vspec_in_flight):
            if output_id == id(scheduler_output):
                del self._vspec_in_flight[index]
                return scheduled
        return None

    def _observe(self, scheduler_output, model_runner_output, completed: float, verified) -> None:
        scheduled = self._take_scheduled(scheduler_output)
        step = vllm_adapter.observed_step(
            scheduler_output, model_runner_output,
            scheduled_at=scheduled.started if scheduled else completed, completed_at=completed,
            verified_gamma=scheduled.verified_gamma if scheduled else None,
            drafting_gamma=scheduled.drafting_gamma if scheduled else None,
            verified=verified, requests=self.requests if self._vspec.wants_context else None,
        )
        self._vspec.observe_step(step, idle_after=not self.running and not self.waiting)

    def _publish_fault(self, frozen_gamma: int) -> None:
        try:
            from vspec_runtime import metrics

            metrics.publish({**self._vspec.snapshot(), "gamma": frozen_gamma, "faulted": True})
        except Exception:  # noqa: BLE001 - best effort; serving matters more than the gauge
            pass

    def _guarded(self, action):
        """``action()``'s result, or None after a fault (logged once; K frozen; vLLM serves on)."""
        try:
            return action()
        except Exception:  # noqa: BLE001 - a controller fault must never take the engine down
            if not self._vspec_faulted:
                self._vspec_faulted = True
                logger.exception("vspec controller fault; freezing K and serving on")
            # at least 1 (speculation keeps running), unless the start-up K itself is 0
            safe = clamp_gamma(self._vspec.current_gamma if self._vspec else 1, min(1, self.num_spec_tokens),
                               self.num_spec_tokens)
            if self._vspec is not None:
                self._publish_fault(safe)
            self._vspec = None
            self._set_gamma(safe)
            return None


class AdaptiveScheduler(AdaptiveHooks, Scheduler):
    """The class ``--scheduler-cls`` names: vLLM's synchronous Scheduler with vspec's hooks, or an
    AsyncAdaptiveScheduler when the resolved vLLM config schedules asynchronously.

    The choice is made in ``__new__`` from the ``vllm_config`` vLLM constructs every scheduler with,
    after vLLM and the platform had their say on async scheduling: the class must match the engine
    core's loop, which follows that same flag (placeholders and no draft hand-back when async)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is AdaptiveScheduler and schedules_async(vllm_config):
            cls = AsyncAdaptiveScheduler
        # A subclass, so Python still runs __init__ with the same arguments.
        return super().__new__(cls)


class AsyncAdaptiveScheduler(AdaptiveScheduler, AsyncScheduler):
    """vspec's hooks over vLLM's AsyncScheduler (method order: hooks, then AsyncScheduler, then
    Scheduler). Built by AdaptiveScheduler when vLLM schedules asynchronously; not named directly."""

    _vspec_drafts_via_scheduler = False
