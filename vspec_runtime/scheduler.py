"""AdaptiveScheduler: vLLM's Scheduler with K chosen by vspec's controller every step.

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

Fault isolation: any exception in vspec's code here is logged once with its traceback, K is frozen
at a safe value and vLLM keeps serving as with a fixed K.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Optional

from vllm.v1.core.sched.scheduler import Scheduler

from vspec_runtime import vllm_adapter, vllm_surface
from vspec_runtime.activation import active_spec
from vspec_runtime.controller import AdaptiveController
from vspec_runtime.patches._base import IncompatibleVllm

logger = logging.getLogger("vspec.scheduler")

_surface_ok = False  # set once the start-up check passed: vLLM cannot change under a running process


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


class AdaptiveScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vspec: Optional[AdaptiveController] = None
        self._vspec_faulted = False
        self._vspec_scheduled_at: deque[tuple[int, float]] = deque(maxlen=8)
        self._vspec_drafting_k = 0  # K the drafter was asked for in the step just scheduled
        spec = active_spec()
        self._vspec_counts_cuts = bool(spec is not None and spec.adaptive.entropy_stop)
        if spec is None or not spec.adaptive_active:
            logger.warning("vspec scheduler loaded without an adaptive vspec spec: behaving like vLLM's Scheduler")
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
        )
        self._set_gamma(self._vspec.current_gamma)
        logger.info(
            "vspec adaptive scheduler: policy=%s K in [%d, %d], max_num_batched_tokens=%d",
            spec.adaptive.policy, spec.adaptive.min_gamma, self.num_spec_tokens, self.max_num_scheduled_tokens,
        )

    # --- hooks ----------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        started = time.perf_counter()
        if self._vspec is not None:
            self._guarded(self._choose_before_schedule)
        output = super().schedule(*args, **kwargs)
        if self._vspec is not None:
            self._vspec_scheduled_at.append((id(output), started))
            self._vspec_drafting_k = output.num_spec_tokens_to_schedule
        return output

    def update_from_output(self, scheduler_output, model_runner_output):  # type: ignore[override]
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self._vspec is not None:
            completed = time.perf_counter()
            self._guarded(lambda: self._observe(scheduler_output, model_runner_output, completed))
        return result

    # --- confidence stop: count per-request cuts (the cut itself happens in the worker) ----------

    def update_draft_token_ids(self, draft_token_ids):  # type: ignore[override]
        """The drafts made for the next step, before vLLM stores them on the requests.

        Confidence stop: the worker-side patch (vspec_runtime/patches/gpu_model_runner.py) already
        trimmed each request's drafts; a list shorter than the K asked for is a confidence cut,
        counted here because the trace lives in this process. Then per-request lengths and client
        caps trim the lists in place (lossless: a shorter draft verifies the kept tokens the same)."""
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

    def _set_gamma(self, gamma: int) -> None:
        lookup = self.dynamic_sd_lookup
        gamma = max(0, min(gamma, self.num_spec_tokens))
        if lookup is not None and lookup[-1] != gamma:
            lookup[1:] = [gamma] * (len(lookup) - 1)  # index 0 unused; every batch size gets K

    def _observe(self, scheduler_output, model_runner_output, completed: float) -> None:
        scheduled_at = completed
        for output_id, started in self._vspec_scheduled_at:
            if output_id == id(scheduler_output):
                scheduled_at = started
                break
        step = vllm_adapter.observed_step(
            scheduler_output, model_runner_output, scheduled_at=scheduled_at, completed_at=completed,
            requests=self.requests if self._vspec.wants_context else None,
        )
        self._vspec.observe_step(step, idle_after=not self.running and not self.waiting)

    def _publish_fault(self, frozen_gamma: int) -> None:
        try:
            from vspec_runtime import metrics

            metrics.publish({**self._vspec.snapshot(), "gamma": frozen_gamma, "faulted": True})
        except Exception:  # noqa: BLE001 - best effort; serving matters more than the gauge
            pass

    def _guarded(self, action) -> None:
        try:
            action()
        except Exception:  # noqa: BLE001 - a controller fault must never take the engine down
            if not self._vspec_faulted:
                self._vspec_faulted = True
                logger.exception("vspec controller fault; freezing K and serving on")
            safe = min(self.num_spec_tokens, max(1, self._vspec.current_gamma if self._vspec else 1))
            if self._vspec is not None:
                self._publish_fault(safe)
            self._vspec = None
            self._set_gamma(safe)
