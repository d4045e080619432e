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

``replay_server`` replays the serve bench's closed loop instead (``ServerMix``): clients that send
their next request as soon as an answer is complete, answers drawn from the serve pool's own
(``benchmarks/demo_runs.py --serve-pool``), loads that start their clients one after another and drain
after the window, as `vspec bench --driver serve --concurrency N` runs them.

Cost per step (``StepCost``): fixed_ms + token_ms x tokens verified (the running requests plus their
drafts), times 1 + noise x N(0, 1). Fitted on bench run 14's fixed-K phases at batch 8 (32.8 ms +
2.71 ms per verified token, with each cell's prefill): every phase within 1% of its measured time.
Batch 1 fits badly (phases off by up to 12%: there a step's cost hardly depends on its tokens, and
order effects dominate), so judge batch-8 cells with it. Pure Python, seeded: a policy's score differs
from another's by its choices and by the cost noise, never by its luck with the text.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from vspec_runtime.control.base import Policy, StepFeedback

__all__ = ["Answer", "ServerMix", "StepCost", "TextCell", "fixed_commit", "replay_cells", "replay_server"]


@dataclass(frozen=True)
class Answer:
    """One recorded answer: per token t, drafts proposed there (``proposed``) and how many are right."""

    proposed: tuple[int, ...]
    right: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.proposed) != len(self.right) or any(r > p for r, p in zip(self.right, self.proposed)):
            raise ValueError("an answer needs one (proposed, right) pair per token with right <= proposed")

    def step(self, position: int, gamma: int) -> tuple[int, int, int]:
        """A step at budget ``gamma`` from answer token ``position``: (drafts made, drafts accepted,
        the position after it), as vLLM steps through this text."""
        drafts = min(gamma, self.proposed[position])
        taken = min(drafts, self.right[position])
        return drafts, taken, min(position + 1 + taken, len(self.right))

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
    # More for a step that drafts at all (K > 0: the proposer, the rejection sampler): on the demo's
    # server, online's K=1 steps of chat at eight clients took 9.43 ms a request where the line
    # through the K>0 steps of a mixed run says 9.06 (docs/benchmarks.md, "Closed loops").
    drafting_ms: float = 0.0

    def step_ms(self, verified_tokens: int, rng: random.Random, gamma: int = 0) -> float:
        base = self.fixed_ms + self.token_ms * verified_tokens + (self.drafting_ms if gamma > 0 else 0.0)
        return base * max(0.2, 1.0 + self.noise * rng.gauss(0.0, 1.0))


def fixed_commit(answers: Iterable[Answer], gamma: int) -> float:
    """Tokens a request commits per step at a fixed K over these answers (after each one's first token,
    which the prefill makes): what the bench's fixed:K counters measure."""
    steps = tokens = 0
    for answer in answers:
        position = 1
        while position < len(answer.right):
            position = answer.step(position, gamma)[2]
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
                drafts, taken, advanced = cell.answers[index].step(position, gamma)
                if drafts:
                    request_ids.append(f"r{index}")
                    drafted.append(drafts)
                    accepted.append(taken)
                verified += drafts
                tokens += advanced - position
                positions[index] = advanced
            interval_ms = cost.step_ms(verified, rng, gamma)
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


@dataclass(frozen=True)
class ServerMix:
    """A busy server's closed loop: ``clients`` clients, each sending its next request as soon as its
    answer is complete, each answer drawn from ``kinds`` (answers per kind, ``weights`` the chance of
    each kind) and cut at ``max_tokens``. The step that admits a request also prefills it
    (``admission_ms`` more, an unstable step, as on the server). ``stagger`` spreads the clients'
    first requests over that fraction of a load, as the serve bench starts its clients."""

    kinds: dict[str, tuple[Answer, ...]]
    weights: dict[str, float]
    clients: int = 8
    max_tokens: int = 64
    admission_ms: float = 50.0
    stagger: float = 0.0

    def draws(self, rng: random.Random) -> Iterator[tuple[str, Answer]]:
        """The answers the clients send, in order, without end: the same for every policy."""
        names = sorted(self.kinds)
        weights = [self.weights.get(name, 0.0) for name in names]
        while True:
            name = rng.choices(names, weights=weights)[0]
            answer = rng.choice(self.kinds[name])
            yield name, Answer(answer.proposed[: self.max_tokens], answer.right[: self.max_tokens])


def replay_server(policy: Policy, mix: ServerMix, *, duration_ms: float = 60_000.0, loads: int = 1, seed: int = 0,
                  cost: StepCost = StepCost(), max_feasible_gamma: int = 64) -> float:
    """Committed tokens per ms of ``policy`` over ``loads`` loads of ``mix``, each ``duration_ms`` (simulated)
    of sending and then the drain of the answers still running, as the serve bench runs a closed
    loop: the rate counts the tokens made while the clients send. The policy keeps its state from
    load to load, as each policy does across a bench's rounds.

    Common random numbers: the n-th request admitted gets the n-th drawn answer whichever policy runs,
    so two policies serve the same texts in the same order (as the serve bench's clients send the same
    prompts) and differ by their choices and the cost noise only.
    """
    draws, cost_rng = mix.draws(random.Random(seed)), random.Random(seed + 1)
    loop = _ClosedLoop(policy, mix, draws, cost, cost_rng, max_feasible_gamma)
    tokens = sum(loop.run_load(duration_ms) for _ in range(loads))
    return tokens / (duration_ms * loads)


class _ClosedLoop:
    """The engine and its clients for ``replay_server``: one step at a time, on a simulated clock."""

    def __init__(self, policy: Policy, mix: ServerMix, draws: Iterator[tuple[str, Answer]], cost: StepCost,
                 cost_rng: random.Random, max_feasible_gamma: int) -> None:
        self.policy, self.mix, self.draws, self.cost, self.cost_rng = policy, mix, draws, cost, cost_rng
        self.max_feasible_gamma = max_feasible_gamma
        self.numbers = itertools.count()
        self.previous: tuple[int, int] | None = None  # (batch, K) of the step before: a stable step repeats it

    def run_load(self, duration_ms: float) -> int:
        """Tokens made while the clients sent (steps ending within ``duration_ms``); then the drain."""
        spacing_ms = self.mix.stagger * duration_ms / self.mix.clients
        starts = [spacing_ms * client for client in range(self.mix.clients)]
        running: dict[str, tuple[Answer, int]] = {}  # request -> (answer, tokens made so far)
        waiting = 0  # clients whose answer is complete and who send again at the next step
        clock_ms, tokens = 0.0, 0
        while True:
            while starts and starts[0] <= clock_ms:
                starts.pop(0)
                waiting += 1
            admitting = [f"s{next(self.numbers)}" for _ in range(waiting if clock_ms < duration_ms else 0)]
            waiting -= len(admitting)
            for request_id in admitting:
                running[request_id] = (next(self.draws)[1], 1)  # the prefill makes the first token
            if not running:
                if not starts:
                    return tokens
                clock_ms = starts[0]  # idle until the next client starts
                self.previous = None
                continue
            step_ms, made, done = self._step(running, set(admitting))
            clock_ms += step_ms
            if clock_ms <= duration_ms:
                tokens += made
            for request_id in done:
                del running[request_id]
            waiting += len(done)

    def _step(self, running: dict[str, tuple[Answer, int]], admitting: set[str]) -> tuple[float, int, list[str]]:
        batch = len(running)
        gamma = self.policy.choose(batch, self.max_feasible_gamma).gamma
        request_ids, drafted, accepted = [], [], []
        verified, made = batch - len(admitting), len(admitting)
        for request_id, (answer, position) in running.items():
            if request_id in admitting:
                continue
            drafts, taken, advanced = answer.step(position, gamma)
            if drafts:
                request_ids.append(request_id)
                drafted.append(drafts)
                accepted.append(taken)
            verified += drafts
            made += advanced - position
            running[request_id] = (answer, advanced)
        interval_ms = self.cost.step_ms(verified, self.cost_rng, gamma) + self.mix.admission_ms * len(admitting)
        self.policy.observe(StepFeedback(
            batch_size=batch, gamma=gamma, drafted=tuple(drafted), accepted=tuple(accepted),
            interval_ms=interval_ms, stable=not admitting and self.previous == (batch, gamma),
            batched_tokens=verified, request_ids=tuple(request_ids), batch_ids=tuple(running),
        ))
        self.previous = (batch, gamma)
        done = [request_id for request_id, (answer, position) in running.items() if position >= len(answer.right)]
        return interval_ms, made, done
