"""OnlineConfig: the settings of one OnlinePolicy, validated once and never mutated."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vspec_runtime.control.rules import KRules, adaptive_settings_problems

if TYPE_CHECKING:
    from vspec_runtime.spec import AdaptiveSettings


@dataclass(frozen=True)
class OnlineConfig:
    """Settings of one OnlinePolicy; validated on construction, never mutated."""

    max_gamma: int
    min_gamma: int = 0
    max_gamma_step: int = 2
    control_interval: int = 4
    hysteresis: float = 0.05
    window: int = 32
    exploration: float = 0.01  # UCB c
    model_guided: bool = True
    seed: int = 0  # breaks exact ties between candidate arms
    start_gamma: int | None = None  # K of the very first bucket; default max_gamma (vLLM's own choice)
    # Model guidance: an unmeasured arm is explored when its optimistic prediction beats the best
    # measured arm by explore_margin; secant predictions are trusted to within prediction_tolerance.
    prediction_tolerance: float = 0.05
    explore_margin: float = 0.01
    prior_slope_fraction: float = 0.05  # cost per draft token / step cost, with one arm measured
    # A measured arm with fewer samples than this whose estimate is within the hysteresis of the
    # best is visited again: four noisy steps must not decide between two arms 2% apart for good.
    confident_samples: int = 16
    # K>0 goes to 0 only on at least this many (decayed) acceptance trials of the first draft. At K=0
    # nothing drafts, so nothing could correct a K=0 chosen on a few unlucky drafts; and a re-probe
    # of a sticky K=0 under continuous load drafts only for the requests that arrived since (about
    # one in ten steps at batch 8), so its first one or two rejected drafts ended it (simulated:
    # K>0 came back 2,000 steps after acceptance rose instead of 20). A full batch gives this many
    # trials in a step or two, so elsewhere it changes nothing.
    evidence_to_stop: float = 16.0
    noise_z: float = 2.0  # width, in standard errors, of an arm's plausible cost range
    # An arm preferred over the current one at this many decisions in a row wins even within the
    # hysteresis (0: never). Noise alternates its preference, a real gap does not, so this keeps
    # the anti-flapping and removes the trap of sitting up to `hysteresis` below the best forever.
    patience_decisions: int = 8
    acceptance_memory_requests: float = 32.0  # horizon of the acceptance model, in drafting requests
    acceptance_stale_half_life_steps: float = 64.0  # how fast undrafted positions fall back to the prior
    # Model guidance reads E[K] of the requests in the batch (their own acceptance, shrunk toward the
    # pooled rates) instead of the pooled E[K] of recent requests: batch_acceptance.py says why.
    batch_acceptance: bool = True
    # Number draft positions along runs of copyable text rather than per step (run_acceptance.py):
    # right for n-gram lookup, whose correct drafts come in runs that outlast a step.
    acceptance_runs: bool = False
    # Price arms with a line of step cost against verified tokens, fitted on the latest steps of any K,
    # instead of each arm's own window (``OnlinePolicy._arm_costs``): robust to a machine whose speed
    # wanders between the visits of two arms, where the drafter's fills vary (n-gram lookup).
    token_costs: bool = True
    # Scale the drafts E[K] counts by how much fewer steps K spends inside runs the drafter gets right
    # than the steps observed did (coverage.py): per-step means read at a small K flatter a large K.
    # Right where acceptance is a property of the text (n-gram lookup copies it); from_settings sets
    # it for n-gram only.
    coverage_weighting: bool = False
    # K>0 goes to 0 at once, past max_gamma_step and before evidence_to_stop, when even the first
    # draft's most optimistic plausible acceptance loses to K=0 (OnlinePolicy._drafting_surely_loses):
    # a model drafter's every trial is a dear step. from_settings sets it for model drafters only.
    sure_zero: bool = False
    # Visit an arm for information (explore past warm-up, firm-up) only when what it may gain, over
    # the steps the regime is expected to last, outweighs what the visit costs (OnlinePolicy._worth_a_visit).
    # Without it, short regimes (a copied answer of nine steps) paid four-step visits to clear losers.
    visit_value: bool = True
    # A firm-up of a thin arm more than max_gamma_step away goes on to it over the next decisions
    # (OnlinePolicy._firm_up_under_way). Without it the move stopped on the arm between, was undone at the
    # next decision, and was made again: K=0, 2, 0, 2, ... under a server's steady chat@8 load. Opt-in
    # until a bench resolves a gain (docs/benchmarks.md, "Closed loops").
    firm_up_follow_through: bool = False
    # Price a step of a batch smaller than its bucket (a draining or filling batch: 5-7 requests in the
    # bucket of 8) as if the bucket's full batch had shared its fixed cost (BucketState.at_bucket_batch).
    # Per request, such a step is dearer whatever K it ran, and the arm whose window caught a drain read
    # dear for the rest of the run: replayed on the serve bench's loads, online on chat at eight clients
    # 0.957x -> 0.992x K=0, mixed traffic 0.992x -> 0.997x the best fixed K; on the server no gain
    # (docs/benchmarks.md, "The server's own text, replayed"). Opt-in.
    batch_normalized_costs: bool = False

    def __post_init__(self) -> None:
        for problem in _config_problems(self):
            raise ValueError(f"online policy: {problem}")

    def k_rules(self) -> KRules:
        """The part of these settings that ``Policy.choose`` applies for every policy."""
        return KRules(
            max_gamma=self.max_gamma,
            min_gamma=self.min_gamma,
            max_gamma_step=self.max_gamma_step,
            control_interval=self.control_interval,
        )

    @classmethod
    def from_settings(cls, adaptive: AdaptiveSettings, max_gamma: int, method: str = "ngram") -> OnlineConfig:
        """``method``: the spec's drafting method (coverage weighting is for n-gram lookup only; the
        sure K=0 for the others: model drafters)."""
        return cls(
            max_gamma=max_gamma,
            min_gamma=min(adaptive.min_gamma, max_gamma),
            max_gamma_step=adaptive.max_gamma_step,
            control_interval=adaptive.control_interval,
            hysteresis=adaptive.hysteresis,
            window=adaptive.online_window,
            exploration=adaptive.online_exploration,
            model_guided=adaptive.model_guided,
            batch_acceptance=adaptive.batch_acceptance,
            token_costs=adaptive.token_costs,
            coverage_weighting=adaptive.coverage_weighting and method == "ngram",
            acceptance_runs=adaptive.acceptance_model == "run",
            sure_zero=method != "ngram",
            visit_value=adaptive.visit_value,
            firm_up_follow_through=adaptive.firm_up_follow_through,
            batch_normalized_costs=adaptive.batch_normalized_costs,
            start_gamma=None if adaptive.start_gamma is None else min(max(adaptive.start_gamma, adaptive.min_gamma),
                                                                       max_gamma),
            seed=adaptive.seed,
        )


def _config_problems(config: OnlineConfig):
    yield from adaptive_settings_problems(config.k_rules(), config.hysteresis)
    if config.max_gamma > 64:
        yield f"max_gamma must be in [0, 64], got {config.max_gamma}"
    if config.confident_samples < 1:
        yield f"confident_samples must be >= 1, got {config.confident_samples}"
    if config.patience_decisions < 0:
        yield f"patience_decisions must be >= 0, got {config.patience_decisions}"
    if not config.evidence_to_stop >= 0.0:
        yield f"evidence_to_stop must be >= 0, got {config.evidence_to_stop}"
    if config.window < 1:
        yield f"window must be >= 1, got {config.window}"
    for name in (
        "exploration",
        "prediction_tolerance",
        "explore_margin",
        "prior_slope_fraction",
        "noise_z",
    ):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0.0):
            yield f"{name} must be a finite number >= 0, got {value}"
    if not config.acceptance_stale_half_life_steps > 0.0:
        yield f"acceptance_stale_half_life_steps must be > 0, got {config.acceptance_stale_half_life_steps}"
    if not config.acceptance_memory_requests >= 1.0:
        yield f"acceptance_memory_requests must be >= 1, got {config.acceptance_memory_requests}"
    if config.start_gamma is not None and not config.min_gamma <= config.start_gamma <= config.max_gamma:
        yield f"start_gamma must be in [min_gamma, max_gamma], got {config.start_gamma}"
