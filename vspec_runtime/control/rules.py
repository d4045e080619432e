"""The rules on K that every policy shares: the one clamp, the step limit, the settings check.

``Policy.choose`` (``base.py``) applies a policy's ``KRules``; the factory and the adaptive
policies' constructors all validate their settings with ``check_adaptive_settings``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class KRules:
    """How K may move, besides what fits in the step. The defaults: any K >= 0, chosen afresh every step."""

    max_gamma: int | None = None  # largest K the policy runs; None: the policy's own choices bound it
    min_gamma: int = 0  # smallest K a decision moves to (it yields to a lower feasibility cap)
    max_gamma_step: int | None = None  # largest move between two decisions of a bucket; None: any
    control_interval: int = 1  # steps of a bucket per decision; the steps in between "hold"


def clamp_gamma(gamma: int, low: int = 0, high: int | None = None) -> int:
    """``gamma`` brought into [low, high] (``high`` None: no upper bound).

    Should the bounds cross, ``low`` wins: with the default low of 0, no rule can produce a negative K.
    """
    return max(low, gamma if high is None else min(gamma, high))


def feasible_cap(max_feasible_gamma: int, max_gamma: int | None) -> int:
    """The largest K a step may run: what fits in it (the caller's bound), and at most ``max_gamma``."""
    return clamp_gamma(int(max_feasible_gamma), 0, max_gamma)


def step_toward(current: int, target: int, max_step: int | None) -> int:
    """``target``, or as far toward it from ``current`` as a move of ``max_step`` goes (None: any move)."""
    if max_step is None:
        return target
    return current + clamp_gamma(target - current, -max_step, max_step)


def adaptive_settings_problems(rules: KRules, hysteresis: float) -> Iterator[str]:
    """What is wrong with the settings every adaptive policy shares, one line each (callers raise the first)."""
    max_gamma, min_gamma = rules.max_gamma, rules.min_gamma
    if not isinstance(max_gamma, int) or max_gamma < 0:
        yield f"max_gamma must be an integer >= 0, got {max_gamma!r}"
    elif not 0 <= min_gamma <= max_gamma:
        yield f"min_gamma must be in [0, max_gamma={max_gamma}], got {min_gamma}"
    if rules.max_gamma_step is None or rules.max_gamma_step < 1:
        yield f"max_gamma_step must be >= 1, got {rules.max_gamma_step}"
    if rules.control_interval < 1:
        yield f"control_interval must be >= 1, got {rules.control_interval}"
    if not (math.isfinite(hysteresis) and hysteresis >= 0.0):
        yield f"hysteresis must be a finite number >= 0, got {hysteresis}"


def check_adaptive_settings(owner: str, rules: KRules, hysteresis: float) -> None:
    """Raise ValueError("<owner>: <first problem>") when the shared adaptive settings are unusable."""
    for problem in adaptive_settings_problems(rules, hysteresis):
        raise ValueError(f"{owner}: {problem}")
