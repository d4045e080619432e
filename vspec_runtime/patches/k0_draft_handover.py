"""Patch: ``vllm.v1.engine.core.EngineCore.post_step`` -- no draft hand-over after a step that drafted nothing.

Why: with a drafter configured and synchronous scheduling, vLLM's engine core asks the workers for
the next step's drafts after every step (``post_step`` -> ``model_executor.take_draft_token_ids()``),
a round trip to the worker process on top of the step's own. After a step that drafted with K=0
the answer is known in advance (an empty list per request), yet the round trip is paid: timed
inside the engine core on the demo (SmolLM2, n-gram drafter, vspec's scheduler held at K=0, 448
steps at batch 1, 448 at batch 8), 0.4-0.5 ms a step at batch 1 and 0.7-0.8 ms at batch 8, about 1%
of a 46-65 ms step: most of what K=0 still cost against target-only at batch 1
(docs/benchmarks.md, "The draft hand-over after K=0 steps").

How: when the engine core's scheduler is vspec's (``AdaptiveHooks.vspec_drafts_pending``) and says
the step that just ran asked the drafter for no tokens (``num_spec_tokens_to_schedule`` 0, which the
model runner passes to every drafter as the number of tokens to propose), ``post_step`` returns
without the round trip. Nothing is lost: vLLM clears each scheduled request's ``spec_token_ids``
when it schedules the step, so the hand-over of empty lists would only have set them to ``[]``
again, and the model runner replaces its stored drafts at the start of the next step. Steps that
drafted (K > 0), a faulted controller and any other scheduler keep vLLM's hand-over as shipped.
Under asynchronous scheduling vLLM makes no hand-over in ``post_step`` at all, so nothing changes.
The round trip that remains after drafting steps is counted in the next step's measured interval
(vspec_runtime/scheduler.py, ``update_draft_token_ids``), so the controller prices K>0 with it
against a K=0 that no longer pays it.

Enabled by: adaptive K (``adaptive.enabled``): only vspec's scheduler runs steps at K=0 with a
drafter configured.

Delete when: vLLM's engine core skips the hand-over for steps scheduled without speculative tokens
(checked with `vspec bench --policies target-only,table:1=0`, K=0 against target-only, with and
without ``VSPEC_DISABLE_PATCHES=k0-draft-handover``); tests/test_runtime_integration.py checks that
the same K script verifies the same drafts with and without it.
"""

from __future__ import annotations

import logging
from types import ModuleType

from vspec_runtime.patches import _base, _hooks

logger = logging.getLogger("vspec.patches")

NAME = "k0-draft-handover"
TARGET_MODULE = "vllm.v1.engine.core"
_CORE = f"{TARGET_MODULE}:EngineCore"
SYMBOLS = (
    f"{_CORE}.post_step",
    f"{_CORE}.scheduler",
)


def install(spec) -> None:
    _hooks.when_imported(TARGET_MODULE, apply)


def apply(module: ModuleType) -> bool:
    _base.check_symbols(NAME, SYMBOLS)
    return _base.patch_attribute(module.EngineCore, "post_step", NAME, _make_post_step)


def _make_post_step(original):
    def post_step(self, model_executed: bool) -> None:
        if model_executed and not _drafts_pending(self.scheduler):
            if _base.first_time(NAME):
                logger.info("vspec patch %s live: a step that drafted nothing skipped the draft hand-over", NAME)
            return
        original(self, model_executed)

    return post_step


def _drafts_pending(scheduler) -> bool:
    """False only when vspec's scheduler knows the step just run drafted nothing."""
    pending = getattr(scheduler, "vspec_drafts_pending", None)
    return True if pending is None else bool(pending())
