"""Relaxed acceptance (opt-in, changes outputs): which greedy drafts to accept beyond exact matches.

Opt-in and output-changing. Under greedy decoding a draft token is accepted when it equals the
target's argmax (strict, lossless) or, relaxed, when the target's logit for it is within ``margin``
of the top logit or it is among the target's ``topk`` tokens, subject to gates: draft position >=
``from_position`` (0-based), at least ``after_tokens`` output tokens before it, and never a
``protected_token_ids`` token (those still pass when they are the exact argmax). Requests that
sample (temperature > 0) are never relaxed: their rows keep vLLM's probabilistic verification.

``relax_greedy_rows`` works on the tensors vLLM's ``rejection_sample`` sees and rewrites only the
rows where relaxation accepted more than strict verification did, so with nothing relaxed the
output is vLLM's, bit for bit. Pure torch; device-agnostic.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID for unused output slots and invalid drafts

# Output tokens each request had generated before this step's verification, in batch order. Set by
# the model-runner patch around sampling; None when unknown (then after_tokens gates refuse).
_generated_before: contextvars.ContextVar[Optional[Sequence[int]]] = contextvars.ContextVar(
    "vspec_generated_before", default=None)


@contextlib.contextmanager
def generated_tokens(per_request: Sequence[int]) -> Iterator[None]:
    token = _generated_before.set(per_request)
    try:
        yield
    finally:
        _generated_before.reset(token)


def current_generated_tokens() -> Optional[Sequence[int]]:
    return _generated_before.get()


@dataclass(frozen=True)
class RelaxedRule:
    margin: Optional[float] = None
    topk: Optional[int] = None
    from_position: int = 0
    after_tokens: int = 0
    protected_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_spec(cls, relaxed) -> "RelaxedRule":
        return cls(margin=relaxed.margin, topk=relaxed.topk, from_position=relaxed.from_position,
                   after_tokens=relaxed.after_tokens, protected_token_ids=tuple(relaxed.protected_token_ids))

    @property
    def enabled(self) -> bool:
        return self.margin is not None or self.topk is not None


@dataclass
class RelaxedStats:
    """Per-process counters (worker side), for logs and tests."""

    verifications: int = 0
    relaxed_tokens: int = 0  # draft tokens accepted only because of relaxation
    relaxed_requests: int = 0  # request-steps whose output relaxation changed


def relax_greedy_rows(
    rule: RelaxedRule,
    strict_output: torch.Tensor,  # [batch, max_spec_len + 1], vLLM's output (modified in place)
    draft_token_ids: torch.Tensor,  # [tokens]
    num_draft_tokens: Sequence[int],  # [batch]
    cu_num_draft_tokens: torch.Tensor,  # [batch], inclusive cumulative sum
    target_argmax: torch.Tensor,  # [tokens]
    near_top: torch.Tensor,  # [tokens] bool: inside the margin / top-k (see near_top_mask)
    bonus_token_ids: torch.Tensor,  # [batch, 1]
    greedy_rows: torch.Tensor,  # [batch] bool
    generated_before: Optional[Sequence[int]],
) -> tuple[int, int]:
    """Accept relaxed drafts in greedy rows; returns (relaxed tokens, rows changed)."""
    device = strict_output.device
    batch = len(num_draft_tokens)
    num_tokens = draft_token_ids.shape[0]
    if batch == 0 or num_tokens == 0:
        return 0, 0
    num_draft = torch.as_tensor(list(num_draft_tokens), device=device, dtype=torch.long)
    request = torch.repeat_interleave(torch.arange(batch, device=device), num_draft)
    start = cu_num_draft_tokens.to(device=device, dtype=torch.long) - num_draft
    position = torch.arange(num_tokens, device=device) - start[request]
    draft = draft_token_ids.to(torch.long)
    argmax = target_argmax.to(torch.long)

    strict_ok = draft == argmax
    eligible = near_top & (draft >= 0) & greedy_rows[request] & (position >= rule.from_position)
    if rule.after_tokens > 0:
        if generated_before is None or len(generated_before) < batch:
            eligible = torch.zeros_like(eligible)
        else:
            before = torch.as_tensor(list(generated_before[:batch]), device=device, dtype=torch.long)
            eligible &= before[request] + position >= rule.after_tokens
    if rule.protected_token_ids:
        protected = torch.as_tensor(rule.protected_token_ids, device=device, dtype=torch.long)
        eligible &= ~torch.isin(draft, protected)
    relaxed_ok = eligible & ~strict_ok

    accepted_strict = _leading_accepted(strict_ok, request, position, num_draft, batch)
    accepted_relaxed = _leading_accepted(strict_ok | relaxed_ok, request, position, num_draft, batch)
    changed = greedy_rows & (accepted_relaxed > accepted_strict)
    if not bool(changed.any()):
        return 0, 0

    rows = torch.full_like(strict_output, PLACEHOLDER)
    keep_draft = position < accepted_relaxed[request]
    rows[request[keep_draft], position[keep_draft]] = draft[keep_draft].to(rows.dtype)
    at_rejection = position == accepted_relaxed[request]
    rows[request[at_rejection], position[at_rejection]] = argmax[at_rejection].to(rows.dtype)
    all_accepted = accepted_relaxed == num_draft
    full_rows = torch.nonzero(all_accepted).flatten()
    rows[full_rows, num_draft[full_rows]] = bonus_token_ids.reshape(-1)[full_rows].to(rows.dtype)
    strict_output[changed] = rows[changed]
    relaxed_tokens = int((relaxed_ok & keep_draft & changed[request]).sum())
    return relaxed_tokens, int(changed.sum())


def near_top_mask(rule: RelaxedRule, target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """[tokens] bool: the draft's target logit is within the margin of the top, or in the top-k."""
    logits = target_logits.float()
    draft = draft_token_ids.to(torch.long).clamp(min=0)
    draft_logit = logits.gather(1, draft.unsqueeze(1)).squeeze(1)
    near = torch.zeros(draft.shape, dtype=torch.bool, device=logits.device)
    if rule.margin is not None:
        near |= draft_logit >= logits.max(dim=-1).values - rule.margin
    if rule.topk is not None:
        kth = logits.topk(min(rule.topk, logits.shape[-1]), dim=-1).values[:, -1]
        near |= draft_logit >= kth
    return near


def _leading_accepted(ok: torch.Tensor, request: torch.Tensor, position: torch.Tensor,
                      num_draft: torch.Tensor, batch: int) -> torch.Tensor:
    """[batch] number of leading accepted drafts per request (up to its first refusal)."""
    never = int(num_draft.max()) + 1 if num_draft.numel() else 1
    refused_at = torch.where(ok, torch.full_like(position, never), position)
    first_refusal = torch.full((batch,), never, dtype=torch.long, device=ok.device)
    first_refusal = first_refusal.scatter_reduce(0, request, refused_at, reduce="amin", include_self=True)
    return torch.minimum(first_refusal, num_draft)
