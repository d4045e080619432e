"""Everything the adaptive scheduler reads from vLLM's per-step objects, read here and nowhere else.

``drafting_batch_size`` reads the scheduler's queues before a step for the batch K is chosen for;
``verified_drafts`` and ``observed_step`` turn one verified step (vLLM's ``SchedulerOutput`` and
``ModelRunnerOutput``) into the controller's ``ObservedStep``; ``confidence_cuts`` reads the drafts
the worker handed back (``DraftTokenIds``). Every member read here is in ``SYMBOLS`` and in
vspec_runtime/vllm_surface.py's SURFACE (needed for "adaptive"), so `vspec doctor` and the
scheduler's start-up check catch an upstream rename instead of the controller silently seeing
nothing and freezing K.

Nothing from vLLM is imported: the objects are read by attribute, which keeps the controller's side
pure Python and lets tests feed hand-built objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Optional

from vspec_runtime.controller import ObservedStep

_SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
_OUT = "vllm.v1.core.sched.output:SchedulerOutput"
_RUNNER_OUT = "vllm.v1.outputs:ModelRunnerOutput"

# The SURFACE targets this module reads (tests/test_vllm_touch_points.py keeps the two in step).
SYMBOLS = (
    f"{_SCHED}.running",
    f"{_SCHED}.waiting",
    f"{_SCHED}.max_num_scheduled_tokens",
    f"{_SCHED}.max_num_active_reqs",
    f"{_SCHED}.kv_cache_manager",
    f"{_SCHED}.block_size",
    "vllm.v1.core.kv_cache_manager:KVCacheManager.block_pool",
    "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks",
    "vllm.v1.request:Request.num_tokens",
    "vllm.v1.request:Request.num_tokens_with_spec",
    "vllm.v1.request:Request.num_output_placeholders",
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


def drafting_batch_size(scheduler: Any) -> int:
    """The requests that will sample a token, and so draft, in the step ``schedule()`` is about to build.

    vLLM reads K inside ``schedule()``, after admission, at the number of requests it scheduled
    (``dynamic_sd_lookup[len(num_scheduled_tokens)]``). vspec writes one K for every batch size before
    ``schedule()``, so the controller needs that batch beforehand, and ``running + waiting`` overstates
    it whenever requests queue: under continuous load the waiting queue holds what does not fit (no
    free running slot, no token budget, no KV blocks), and a request given a prompt chunk that does
    not finish its prompt samples nothing, so drafts nothing.

    This replays ``schedule()``'s admission on counts: the running requests first, in order, each
    taking what it still needs from the step's token budget (its token plus its drafts when decoding,
    the rest of its prompt when prefilling), then the waiting ones in queue order while there is a
    running slot (``max_num_active_reqs``), budget, and free KV blocks for what they are given. A
    request drafts when it gets all it needs. Left out, so the count can be off by them: prefix-cache
    hits (a cached prompt needs fewer tokens and blocks, so admissions are undercounted), blocks the
    running requests take or free this step, preemption, ``long_prefill_token_threshold``, draft
    slots, encoder budgets, LoRA limits and requests waiting for remote KV.

    At least 1 while any request is in flight: 0 tells the controller that the engine went idle.
    """
    budget = scheduler.max_num_scheduled_tokens
    drafting = 0
    for request in scheduler.running:
        if budget <= 0:
            break
        needed = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        if needed <= 0:
            continue  # nothing to run this step (a step still in flight under async scheduling)
        given = min(needed, budget)
        budget -= given
        drafting += given == needed
    drafting += _admitted_and_drafting(scheduler, budget)
    if drafting == 0 and (scheduler.running or len(scheduler.waiting)):
        return 1
    return drafting


def _admitted_and_drafting(scheduler: Any, budget: int) -> int:
    """Waiting requests that ``schedule()`` admits with their whole prompt, given the budget left."""
    slots = scheduler.max_num_active_reqs - len(scheduler.running)
    if budget <= 0 or slots <= 0 or not len(scheduler.waiting):
        return 0
    kv_cache_manager = scheduler.kv_cache_manager
    block_pool = kv_cache_manager.block_pool
    free_blocks = block_pool.get_num_free_blocks()
    block_size = scheduler.block_size
    drafting = 0
    for request in scheduler.waiting:
        needed = request.num_tokens - request.num_computed_tokens
        given = min(needed, budget)
        blocks = -(-given // block_size)
        if blocks > free_blocks:
            break  # vLLM stops admitting at the first request that does not fit
        free_blocks -= blocks
        budget -= given
        slots -= 1
        drafting += given == needed
        if budget <= 0 or slots <= 0:
            break
    return drafting


@dataclass(frozen=True)
class Verified:
    """What a step verified, per request with drafts, and the requests whose output vLLM drops."""

    request_ids: tuple[str, ...] = ()
    drafted: tuple[int, ...] = ()  # drafts verified
    accepted: tuple[int, ...] = ()  # drafts accepted (tokens sampled - 1)
    gone: frozenset[str] = frozenset()  # finished or aborted before the output arrived


def verified_drafts(scheduler_output: Any, model_runner_output: Any, requests: Mapping[str, Any]) -> Verified:
    """Read a step's verification before vLLM processes its output, which trims a request's sampled
    tokens in place at its stop (max_tokens, a stop token) and frees the requests that finish.

    Requests that were gone before the output arrived (``gone_requests``) are left out, as vLLM's
    own counters leave them out."""
    gone = gone_requests(scheduler_output, requests)
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    # Drafts vLLM invalidated before verification (e.g. past a stop) were never really tried.
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    return Verified(*_verified(spec_tokens, invalid, model_runner_output, gone), gone=gone)


def observed_step(
    scheduler_output: Any,
    model_runner_output: Any,
    *,
    scheduled_at: float,
    completed_at: float,
    verified_gamma: Optional[int] = None,
    drafting_gamma: Optional[int] = None,
    verified: Optional[Verified] = None,
    requests: Optional[Mapping[str, Any]] = None,
) -> ObservedStep:
    """One verified step as the controller sees it.

    ``verified_gamma`` and ``drafting_gamma`` are the K that made the drafts this step verified and
    the K it asked the drafter for (the scheduler remembers them from ``schedule()``). ``verified``
    is what ``verified_drafts`` read before vLLM processed the output (None: read it now). Requests
    gone before the output arrived served nothing: they are left out of the batch and of the drafts,
    while the step's tokens and time still include them. ``requests`` is the scheduler's live
    request table; give it only when the controller wants context tokens (summing them costs a pass
    over the batch every step).

    Under asynchronous scheduling a request's scheduled drafts are -1 placeholders, as many as the
    previous step's K; the model runner verified its own drafts in their place, so their count is
    still the number of drafts verified.
    """
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    if verified is None:
        invalid = scheduler_output.num_invalid_spec_tokens or {}
        verified = Verified(*_verified(spec_tokens, invalid, model_runner_output))
    num_scheduled = scheduler_output.num_scheduled_tokens
    gone = verified.gone
    batch_ids = tuple(rid for rid in num_scheduled if rid not in gone) if gone else tuple(num_scheduled)
    return ObservedStep(
        drafted=verified.drafted,
        accepted=verified.accepted,
        request_ids=verified.request_ids,
        batch_ids=batch_ids,
        finished=tuple(scheduler_output.finished_req_ids or ()),
        batch_size=len(batch_ids),
        pure_decode=pure_decode(scheduler_output, spec_tokens, num_scheduled),
        scheduled_at=scheduled_at,
        completed_at=completed_at,
        verified_gamma=verified_gamma,
        drafting_gamma=drafting_gamma,
        batched_tokens=scheduler_output.total_num_scheduled_tokens,
        context_tokens=_context_tokens(num_scheduled, requests) if requests is not None else 0,
    )


def _verified(spec_tokens: Mapping[str, Any], invalid: Mapping[str, int], model_runner_output: Any,
              gone: Collection[str] = ()) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Per request with drafts: its id, drafts verified and drafts accepted (tokens sampled - 1)."""
    sampled = model_runner_output.sampled_token_ids
    index_of = model_runner_output.req_id_to_index
    request_ids, drafted, accepted = [], [], []
    for req_id, drafts in spec_tokens.items():
        index = index_of.get(req_id)
        if index is None or not sampled or index >= len(sampled):
            continue  # no sampled tokens for it in this output: nothing to learn
        if req_id in gone:
            continue  # vLLM discards this output: nothing was committed
        request_ids.append(req_id)
        drafted.append(len(drafts) - invalid.get(req_id, 0))
        accepted.append(max(len(sampled[index]) - 1, 0))
    return tuple(request_ids), tuple(drafted), tuple(accepted)


def gone_requests(scheduler_output: Any, requests: Mapping[str, Any]) -> frozenset[str]:
    """Requests of this step that finished or were aborted before its output arrived.

    Asynchronous scheduling schedules step N+1 before step N's output says a request stopped, and an
    abort can land while a step runs (both modes); vLLM skips such outputs. Call it before
    ``update_from_output``, which frees the requests that finish in this very step. A finished
    request leaves the table when vLLM frees it, at once unless a KV connector still holds its
    blocks (then it is counted as served): one set difference, not a call per request, because this
    runs every step over the whole batch."""
    return frozenset(scheduler_output.num_scheduled_tokens.keys() - requests.keys())


def pure_decode(scheduler_output: Any, spec_tokens: Optional[Mapping[str, Any]] = None,
                num_scheduled: Optional[Mapping[str, int]] = None) -> bool:
    """Nobody admitted, preempted or prefilling: every request ran its one token plus its drafts.

    Only such steps measure the cost of a K cleanly, so only they feed the policy's cost windows; and
    with prefix caching on, only in such steps may the K=0 fast path skip a model drafter
    (``control.sticky.skips_drafter``)."""
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
        cap = draft_cap_of(request)
        if cap is not None:
            caps[req_id] = cap
    return offered, caps


def draft_cap_of(request: Any) -> Optional[int]:
    """The cap a client set on this request (``vllm_xargs: {"vspec_max_draft": N}``), or None."""
    sampling_params = request.sampling_params
    extra = sampling_params.extra_args if sampling_params is not None else None
    if extra and MAX_DRAFT_ARG in extra:
        return draft_cap(extra[MAX_DRAFT_ARG])
    return None


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
