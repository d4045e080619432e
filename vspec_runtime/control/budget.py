"""Micro-benchmark of a policy's per-step cost (choose + observe), for the benchmark script.

The budget for a decision plus its feedback is well under 0.1 ms of Python per step, small next to
a decode step. This is measured, never asserted in tests: wall-clock thresholds make tests flaky.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from vspec_runtime.control.base import Policy, StepFeedback
from vspec_runtime.control.rules import clamp_gamma
from vspec_runtime.control.simulate import accepted_run


def _feedback_pool(
    batch_size: int, max_gamma: int, acceptance_rate: float, variants: int, seed: int
) -> list[list[StepFeedback]]:
    """Ready-made feedback per K, so that building it is not part of what is timed."""
    rng = random.Random(seed)
    probabilities = (acceptance_rate,) * max(1, max_gamma)
    # Request identities, as the scheduler passes them: what per-request bookkeeping (the batch's
    # own acceptance, runs of copyable text) works from.
    ids = tuple(f"r{request}" for request in range(batch_size))
    pool = []
    for gamma in range(max_gamma + 1):
        samples = []
        for _ in range(variants):
            accepted = tuple(accepted_run(rng.random(), probabilities, gamma) for _ in range(batch_size))
            samples.append(
                StepFeedback(
                    batch_size=batch_size,
                    gamma=gamma,
                    drafted=(gamma,) * batch_size,
                    accepted=accepted,
                    interval_ms=20.0 + 0.5 * gamma + rng.random(),
                    stable=True,
                    context_tokens=512 * batch_size,
                    batched_tokens=batch_size * (gamma + 1),
                    request_ids=ids if gamma else (),
                    batch_ids=ids,
                )
            )
        pool.append(samples)
    return pool


def time_per_decision_us(
    policy_factory: Callable[[], Policy],
    steps: int = 5000,
    *,
    batch_size: int = 8,
    max_gamma: int = 6,
    acceptance_rate: float = 0.7,
    seed: int = 0,
) -> float:
    """Mean wall time of one choose() plus one observe(), in microseconds."""
    pool = _feedback_pool(batch_size, max_gamma, acceptance_rate, variants=64, seed=seed)
    policy = policy_factory()
    clock = time.perf_counter
    started = clock()
    for step in range(steps):
        decision = policy.choose(batch_size, max_gamma)
        samples = pool[clamp_gamma(decision.gamma, 0, max_gamma)]
        policy.observe(samples[step % len(samples)])
    return (clock() - started) / steps * 1e6
