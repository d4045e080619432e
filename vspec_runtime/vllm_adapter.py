"""Everything the adaptive scheduler reads from vLLM's per-step objects, read here and nowhere else.

``observed_step`` turns one verified step (vLLM's ``SchedulerOutput`` and ``ModelRunnerOutput``)
into the controller's ``ObservedStep``; ``confidence_cuts`` reads the drafts the worker handed back
(``DraftTokenIds``). Every member read here is in ``SYMBOLS`` and in
vspec_runtime/vllm_surface.py's SURFACE (needed for "adaptive"), so `vspec doctor` and the
scheduler's start-up check catch an upstream rename instead of the controller silently seeing
nothing and freezing K.

Nothing from vLLM is imported: the objects are read by attribute, which keeps the controller's side
pure Python and lets tests feed hand-built objects.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from vspec_runtime.controller import ObservedStep

_OUT = "vllm.v1.core.sched.output:SchedulerOutput"
_RUNNER_OUT = "vllm.v1.outputs:ModelRunnerOutput"

# The SURFACE targets this module reads (tests/test_vllm_touch_points.py keeps the two in step).
SYMBOLS = (
    f"{_OUT}.scheduled_spec_decode_tokens",
    f"{_OUT}.num_invalid_spec_tokens",
    f"{_OUT}.num_scheduled_tokens",
    f"{_OUT}.total_num_scheduled_tokens",
    f"{_OUT}.scheduled_new_reqs",
    f"{_OUT}.preempted_req_ids",
    f"{_RUNNER_OUT}.sampled_token_ids",
    f"{_RUNNER_OUT}.req_id_to_index",
    "vllm.v1.outputs:DraftTokenIds.req_ids",
    "vllm.v1.outputs:DraftTokenIds.draft_token_ids",
    "vllm.v1.request:Request.is_finished",
    "vllm.v1.request:Request.is_prefill_chunk",
    "vllm.v1.request:Request.num_computed_tokens",
    "vllm.v1.request:Request.sampling_params",
    "vllm.sampling_params:SamplingParams.extra_args",
    f"{_OUT}.finished_req_ids",
)

# The per-request cap a client sets through the OpenAI API: {"vllm_xargs": {"vspec_max_draft": 0}}.
MAX_DRAFT_ARG = "vspec_max_draft"


def observed_step(
    scheduler_output: Any,
    model_runner_output: Any,
    *,
    scheduled_at: float,
    completed_at: float,
    requests: Optional[Mapping[str, Any]] = None,
) -> ObservedStep:
    """One verified step as the controller sees it.

    ``requests`` is the scheduler's live request table; give it only when the controller wants
    context tokens (summing them costs a pass over the batch every step).
    """
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    # Drafts vLLM invalidated before verification (e.g. past a stop) were never really tried.
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    request_ids, drafted, accepted = _verified(spec_tokens, invalid, model_runner_output)
    num_scheduled = scheduler_output.num_scheduled_tokens
    return ObservedStep(
        drafted=drafted,
        accepted=accepted,
        request_ids=request_ids,
        batch_ids=tuple(num_scheduled),
        finished=tuple(scheduler_output.finished_req_ids or ()),
        batch_size=len(num_scheduled),
        pure_decode=pure_decode(scheduler_output, spec_tokens, num_scheduled),
        scheduled_at=scheduled_at,
        completed_at=completed_at,
        batched_tokens=scheduler_output.total_num_scheduled_tokens,
        context_tokens=_context_tokens(num_scheduled, requests) if requests is not None else 0,
    )


def _verified(spec_tokens: Mapping[str, Any], invalid: Mapping[str, int],
              model_runner_output: Any) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Per request with drafts: its id, drafts verified and drafts accepted (tokens sampled - 1)."""
    sampled = model_runner_output.sampled_token_ids
    index_of = model_runner_output.req_id_to_index
    request_ids, drafted, accepted = [], [], []
    for req_id, drafts in spec_tokens.items():
        index = index_of.get(req_id)
        if index is None or not sampled or index >= len(sampled):
            continue  # no sampled tokens for it in this output: nothing to learn
        request_ids.append(req_id)
        drafted.append(len(drafts) - invalid.get(req_id, 0))
        accepted.append(max(len(sampled[index]) - 1, 0))
    return tuple(request_ids), tuple(drafted), tuple(accepted)


def pure_decode(scheduler_output: Any, spec_tokens: Optional[Mapping[str, Any]] = None,
                num_scheduled: Optional[Mapping[str, int]] = None) -> bool:
    """Nobody admitted, preempted or prefilling: every request ran its one token plus its drafts.

    Only such steps measure the cost of a K cleanly, so only they feed the policy's cost windows; and
    only in such steps may the K=0 fast path skip a model drafter (patches/k0_fast_path.py)."""
    if spec_tokens is None:
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    if num_scheduled is None:
        num_scheduled = scheduler_output.num_scheduled_tokens
    return (
        not scheduler_output.scheduled_new_reqs
        and not scheduler_output.preempted_req_ids
        and all(count == 1 + len(spec_tokens.get(req_id, ())) for req_id, count in num_scheduled.items())
    )


def _context_tokens(num_scheduled: Mapping[str, int], requests: Mapping[str, Any]) -> int:
    return sum(requests[rid].num_computed_tokens for rid in num_scheduled if rid in requests)


def _live_drafts(draft_token_ids: Any, requests: Mapping[str, Any]):
    """(request id, drafts, request) for each non-empty draft of a request that is still decoding.

    Finished and still-prefilling requests are left out: vLLM drops their drafts anyway."""
    for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
        request = requests.get(req_id)
        if request is None or not drafts or request.is_finished() or request.is_prefill_chunk:
            continue
        yield req_id, drafts, request


def confidence_cuts(draft_token_ids: Any, requests: Mapping[str, Any], asked: int) -> dict[str, int]:
    """Requests whose drafts the worker cut below the ``asked`` K: request id -> drafts kept."""
    return {req_id: len(drafts) for req_id, drafts, _ in _live_drafts(draft_token_ids, requests)
            if len(drafts) < asked}


def offered_drafts(draft_token_ids: Any, requests: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """What the drafter handed back: drafts per live decoding request, and the caps clients asked for.

    A cap is ``vllm_xargs: {"vspec_max_draft": N}`` in the request (vLLM keeps it in
    ``SamplingParams.extra_args``); a value that is not a whole number >= 0 is ignored (``draft_cap``)."""
    offered: dict[str, int] = {}
    caps: dict[str, int] = {}
    for req_id, drafts, request in _live_drafts(draft_token_ids, requests):
        offered[req_id] = len(drafts)
        sampling_params = request.sampling_params
        extra = sampling_params.extra_args if sampling_params is not None else None
        if extra and MAX_DRAFT_ARG in extra:
            cap = draft_cap(extra[MAX_DRAFT_ARG])
            if cap is not None:
                caps[req_id] = cap
    return offered, caps


def draft_cap(value: Any) -> Optional[int]:
    """A whole number >= 0 as JSON gives it (0, 2.0 or "3"); anything else is no cap."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, (int, float)) and value >= 0 and float(value).is_integer():
        return int(value)
    return None


def trim_drafts(draft_token_ids: Any, lengths: Mapping[str, int]) -> None:
    """Shorten each request's draft list in place to ``lengths[req_id]`` (requests not named keep theirs)."""
    for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
        keep = lengths.get(req_id)
        if keep is not None and keep < len(drafts):
            del drafts[keep:]
