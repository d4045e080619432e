"""Confidence stop (lossless): where to cut each request's draft. Pure torch.

For each drafted position the drafter's distribution is reduced to its top-k probabilities,
renormalised, and its entropy H taken (0 .. ln k nats). A request's draft stops at the first
position with ``H * scale > threshold**2``; that token is kept and the rest dropped. Defaults
(k=2, scale 0.15, threshold 0.3) cut where H > 0.6 nats, i.e. where the drafter's two best tokens
are closer than about 70/30. Lossless: the cut only removes drafts before verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ConfidenceStop:
    topk: int = 2
    threshold: float = 0.3
    scale: float = 0.15

    @classmethod
    def from_spec(cls, adaptive) -> "ConfidenceStop":
        return cls(topk=adaptive.entropy_topk, threshold=adaptive.entropy_threshold, scale=adaptive.entropy_scale)

    def topk_entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] logits -> [rows] entropy (nats) of the renormalised top-k distribution."""
        k = min(self.topk, logits.shape[-1])
        top = logits.float().topk(k, dim=-1).values
        log_p = top.log_softmax(dim=-1)
        return -(log_p.exp() * log_p).sum(dim=-1)

    def keep_lengths(self, entropies: torch.Tensor) -> torch.Tensor:
        """[requests, K] entropies -> [requests] drafts to keep (1..K): up to the first uncertain one."""
        num_positions = entropies.shape[1]
        uncertain = entropies * self.scale > self.threshold ** 2
        positions = torch.arange(num_positions, device=entropies.device)
        first_uncertain = torch.where(uncertain, positions, num_positions).min(dim=1).values
        return torch.clamp(first_uncertain + 1, max=num_positions)


def trim_drafts(drafts: list[list[int]], keep: list[int]) -> int:
    """Cut each row of ``drafts`` to its ``keep`` length in place; returns the drafts dropped."""
    dropped = 0
    for row, length in zip(drafts, keep):
        if 0 < length < len(row):
            dropped += len(row) - length
            del row[length:]
    return dropped
