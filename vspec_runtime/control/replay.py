"""Replay recorded answers through a policy: what each K commits is exact, only the step's cost is modelled.

``simulate.py`` draws acceptance from a process (rates per position, runs of a drawn length), and
whether its processes look like real text is a guess; on the demo's code prompts they did not (the
three acceptance models ranked differently there than on the demo bench). This module replays the
demo's own answers instead. n-gram lookup is a pure function of the context and the demo's answers
are greedy, the same for every K, so two numbers per answer token t decide every step: P(t), the
drafts the lookup proposes there, and L(t) <= P(t), how many of them are right
(``benchmarks/demo_runs.py`` records them with vLLM's own proposer). A step at budget K from token t
drafts min(K, P(t)), accepts min(K, L(t)) and moves to t + 1 + min(K, L(t)): exactly what vLLM does on
that text (``fixed_commit`` agrees with the bench's fixed-K counters within 1%).

A cell is ``rounds`` closed batches: every answer of the cell starts at once (a prefill charged as
``prefill_ms``), each step runs the requests still going at the K the policy chose, and a request
leaves when its answer is done, so the batch drains as on the bench. The policy keeps its state
across rounds and cells, as each policy does in an interleaved bench run.

Cost per step (``StepCost``): fixed_ms + token_ms x tokens verified (the running requests plus their
drafts), times 1 + noise x N(0, 1). Fitted on bench run 14's fixed-K phases at batch 8 (32.8 ms +
2.71 ms per verified token, with each cell's prefill): every phase within 1% of its measured time.
Batch 1 fits badly (phases off by up to 12%: there a step's cost hardly depends on its tokens, and
order effects dominate), so judge batch-8 cells with it. Pure Python, seeded: a policy's score differs
from another's by its choices and by the cost noise, never by its luck with the text.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vspec_runtime.control.base import Policy, StepFeedback

__all__ = ["Answer", "StepCost", "TextCell", "fixed_commit", "replay_cells"]


@dataclass(frozen=True)
class Answer:
    """One recorded answer: per token t, drafts proposed there (``proposed``) and how many are right."""

    proposed: tuple[int, ...]
    right: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.proposed) != len(self.right) or any(r > p for r, p in zip(self.right, self.proposed)):
            raise ValueError("an answer needs one (proposed, right) pair per token with right <= proposed")

    @classmethod
    def from_record(cls, record: dict[str, Sequence[int]]) -> Answer:
        """From ``benchmarks/demo_runs.py``'s {"P": [...], "L": [...]}."""
        return cls(tuple(record["P"]), tuple(record["L"]))


@dataclass(frozen=True)
class TextCell:
    """A bench cell to replay: its answers (one batch), and the prefill a round of them costs."""

    name: str
    answers: tuple[Answer, ...]
    prefill_ms: float = 0.0


@dataclass(frozen=True)
class StepCost:
    """Milliseconds per step; the defaults are the demo's at batch 8 (module docstring)."""

    fixed_ms: float = 32.8
    token_ms: float = 2.71
    noise: float = 0.03

    def step_ms(self, verified_tokens: int, rng: random.Random) -> float:
        return (self.fixed_ms + self.token_ms * verified_tokens) * max(0.2, 1.0 + self.noise * rng.gauss(0.0, 1.0))


def fixed_commit(answers: Iterable[Answer], gamma: int) -> float:
    """Tokens a request commits per step at a fixed K over these answers (after each one's first token,
    which the prefill makes): what the bench's fixed:K counters measure."""
    steps = tokens = 0
    for answer in answers:
        position = 1
        while position < len(answer.right):
            position += 1 + min(gamma, answer.right[position])
            steps += 1
        tokens += max(len(answer.right) - 1, 0)
    return tokens / steps if steps else 1.0


def replay_cells(policy: Policy, cells: Sequence[TextCell], *, rounds: int = 8, seed: int = 0,
                 cost: StepCost = StepCost(), max_feasible_gamma: int = 64) -> dict[str, float]:
    """Run ``policy`` through every cell in order; returns committed tokens per ms for each cell."""
    rng = random.Random(seed)
    return {cell.name: _replay_cell(policy, cell, rounds, rng, cost, max_feasible_gamma) for cell in cells}


def _replay_cell(policy: Policy, cell: TextCell, rounds: int, rng: random.Random, cost: StepCost,
                 max_feasible_gamma: int) -> float:
    tokens, elapsed_ms = 0, 0.0
    for _ in range(rounds):
        elapsed_ms += cell.prefill_ms
        positions = {index: 1 for index, answer in enumerate(cell.answers) if len(answer.right) > 1}
        previous: tuple[int, int] | None = None  # (batch, K) of the step before: a stable step repeats it
        while positions:
            batch = len(positions)
            gamma = policy.choose(batch, max_feasible_gamma).gamma
            request_ids, drafted, accepted = [], [], []
            verified = batch
            for index, position in list(positions.items()):
                answer = cell.answers[index]
                drafts = min(gamma, answer.proposed[position])
                taken = min(drafts, answer.right[position])
                if drafts:
                    request_ids.append(f"r{index}")
                    drafted.append(drafts)
                    accepted.append(taken)
                verified += drafts
                advanced = min(position + 1 + taken, len(answer.right))
                tokens += advanced - position
                positions[index] = advanced
            interval_ms = cost.step_ms(verified, rng)
            elapsed_ms += interval_ms
            policy.observe(StepFeedback(
                batch_size=batch, gamma=gamma, drafted=tuple(drafted), accepted=tuple(accepted),
                interval_ms=interval_ms, stable=previous == (batch, gamma), batched_tokens=verified,
                request_ids=tuple(request_ids), batch_ids=tuple(f"r{index}" for index in positions),
            ))
            previous = (batch, gamma)
            positions = {index: position for index, position in positions.items()
                         if position < len(cell.answers[index].right)}
    return tokens / elapsed_ms if elapsed_ms else 0.0
