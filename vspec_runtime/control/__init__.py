"""Policies that choose the speculation length K each step (docs/architecture.md, "Controller maths").

Pure Python: nothing here imports vLLM, torch or numpy, so every policy runs against the seeded
simulator in ``simulate.py`` and costs microseconds per decision.

``make_policy`` builds the policy the settings ask for, wrapped in ``GuardedPolicy`` so that a
policy bug freezes K at a safe value instead of failing a serving step.

Modules: base (the contract, and ``Policy.choose``: the rules every policy shares), rules (the one
K clamp, the step limit, the check of the shared adaptive settings), acceptance (per-position rates, E[K]), window (an arm's sliding
window, buckets), prediction (cost of unmeasured arms), online / online_config / bucket_state (the
bandit), latency_profile / profile_policy (the profile format and policy), static (fixed, table),
guard (fault isolation), simulate (seeded simulator and oracle), budget (micro-benchmark).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.base import Decision, Policy, StepFeedback
from vspec_runtime.control.guard import GuardedPolicy
from vspec_runtime.control.latency_profile import PROFILE_SCHEMA, ComponentLatency, LatencyProfile
from vspec_runtime.control.online import OnlineConfig, OnlinePolicy
from vspec_runtime.control.profile_policy import ProfilePolicy
from vspec_runtime.control.rules import KRules, check_adaptive_settings
from vspec_runtime.control.static import FixedPolicy, TablePolicy
from vspec_runtime.control.sweep import SweepPolicy
from vspec_runtime.control.window import bucket_of

if TYPE_CHECKING:
    from vspec_runtime.spec import AdaptiveSettings

__all__ = [
    "PROFILE_SCHEMA",
    "AcceptanceStats",
    "ComponentLatency",
    "Decision",
    "FixedPolicy",
    "GuardedPolicy",
    "LatencyProfile",
    "OnlineConfig",
    "OnlinePolicy",
    "Policy",
    "ProfilePolicy",
    "StepFeedback",
    "SweepPolicy",
    "TablePolicy",
    "bucket_of",
    "make_policy",
]


def make_policy(adaptive: AdaptiveSettings, max_gamma: int, profile: dict[str, Any] | None = None,
                method: str = "ngram") -> Policy:
    """The policy ``adaptive.policy`` names, for candidates K in [min_gamma, max_gamma], guarded.

    ``max_gamma`` is the start-up num_speculative_tokens. ``profile`` is the profile JSON already
    loaded by the caller (required for policy "profile"); ``method`` the spec's drafting method. On a
    policy fault the guard runs ``fixed_gamma`` if set, else ``max_gamma``: what vLLM would have done
    without vspec.
    Raises ValueError with a one-line message on settings the policy cannot run with.
    """
    # Checked here as well as in the policies: they lower a min_gamma above their largest K (right
    # for a profile that covers fewer K), so only this check sees one above the engine's K.
    rules = KRules(max_gamma, adaptive.min_gamma, adaptive.max_gamma_step, adaptive.control_interval)
    check_adaptive_settings("adaptive settings", rules, adaptive.hysteresis)
    inner = _build(adaptive, max_gamma, profile, method)
    safe_gamma = min(adaptive.fixed_gamma if adaptive.fixed_gamma is not None else max_gamma, max_gamma)
    return GuardedPolicy(inner, safe_gamma=safe_gamma, max_gamma=max_gamma)


def _build(adaptive: AdaptiveSettings, max_gamma: int, profile: dict[str, Any] | None, method: str) -> Policy:
    if adaptive.policy == "online":
        return OnlinePolicy(OnlineConfig.from_settings(adaptive, max_gamma, method))
    if adaptive.policy == "profile":
        if profile is None:
            raise ValueError("adaptive.profile: policy 'profile' needs a profile (--adaptive-profile PATH)")
        return ProfilePolicy(
            LatencyProfile.from_dict(profile, serving_max_gamma=max_gamma),
            max_gamma=max_gamma,
            min_gamma=adaptive.min_gamma,
            max_gamma_step=adaptive.max_gamma_step,
            control_interval=adaptive.control_interval,
            hysteresis=adaptive.hysteresis,
        )
    if adaptive.policy == "fixed":
        gamma = adaptive.fixed_gamma if adaptive.fixed_gamma is not None else max_gamma
        if gamma > max_gamma:
            raise ValueError(f"adaptive.fixed_gamma: got {gamma}; must be <= gamma ({max_gamma})")
        return FixedPolicy(gamma)
    if adaptive.policy == "table":
        if not adaptive.table:
            raise ValueError("adaptive.table: policy 'table' needs a batch-size -> K table")
        return TablePolicy({batch: min(k, max_gamma) for batch, k in adaptive.table.items()})
    if adaptive.policy == "sweep":
        if not adaptive.sweep_gammas:
            raise ValueError("adaptive.sweep_gammas: policy 'sweep' needs the list of K values to cycle through")
        too_big = [k for k in adaptive.sweep_gammas if k > max_gamma]
        if too_big:
            raise ValueError(f"adaptive.sweep_gammas: got {too_big[0]}; must be <= gamma ({max_gamma})")
        return SweepPolicy(adaptive.sweep_gammas, adaptive.control_interval)
    raise ValueError(f"adaptive.policy: unknown policy {adaptive.policy!r}")
