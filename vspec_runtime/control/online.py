"""OnlinePolicy: a bandit over K per batch-size bucket, with model-guided exploration.

Reward of a step is goodput: committed tokens / the non-overlapping step interval (tokens per ms).
Only stable decode steps count toward rewards; every verified step feeds the acceptance model.
Arms are K in [min_gamma, max_gamma], kept per bucket (next power of two of the batch size), each
with a sliding window of its last ``window`` stable steps.

Two ways to estimate an arm (``model_guided``):

* off (the reference design): the arm's own ratio of sums, tokens / ms over its window. Warm-up visits
  every arm once, then goes to the best measured.
* on (default): goodput(K) = E[K] * requests / ms, with E[K] from the acceptance model shared by all
  arms and buckets, and requests / ms (the arm's cost) from the arm's own window. Why: E[K] pools
  every verified step, so it is far less noisy than one arm's token count at small batch, and it
  follows a workload phase change as soon as the acceptance rates move, where the windows of arms
  we are not on would keep stale samples. The cost is what the hardware says, and only the arm's
  own window knows it. An arm not measured yet gets a *predicted* cost (``prediction.py``): from
  the measured arms of the bucket (a line in K, or with one arm the neighbour bucket's curve or a
  prior slope), i.e. reward(t) = reward(a) * (E[t]/E[a]) / cost_ratio(t, a). Warm-up visits only
  arms whose *optimistic* prediction beats the best measured arm, so it does not walk through every
  K when acceptance is obviously high or obviously useless, and an arm that becomes promising later
  (the acceptance model moved) is explored then. E[K] is read for the requests in the batch
  (``batch_acceptance``, default): each request's own acceptance, shrunk toward the pooled rates,
  so a draining batch whose slow requests are left gets their E[K], not that of the fast ones
  that finished (``batch_acceptance.py``). For n-gram lookup (``coverage_weighting``, default there)
  the drafts that E[K] counts are then scaled per token of the text covered (``coverage.py``): a
  small K spends more steps inside runs than a large K would, and its per-step mean flatters the large
  K. With ``acceptance_runs`` (opt-in) E[K] comes instead from the run model (``run_acceptance.py``):
  its correct drafts come in runs that outlast a step, and per-step position rates measured at one K
  misjudge every other K.

Beyond the reference, these rules keep the estimates honest at little cost:

* Thin contenders: a measured arm with fewer than ``confident_samples`` samples whose estimate,
  plus its noise margin, comes within the hysteresis of the best is visited again. Near-tied arms
  are cheap to visit, and four noisy steps must not settle a 2% difference for good. With
  ``firm_up_follow_through`` (opt-in) a firm-up farther than one move goes on to its arm.
* Patience: an arm preferred over the current one at ``patience_decisions`` decisions in a row wins
  even inside the hysteresis. Noise alternates the preference, a real gap does not; a fixed 5%
  hysteresis alone would let the policy sit up to 5% below the best forever.
* Forgetting: when the acceptance model notices a new workload phase, every bucket drops its arm
  costs and measures again. A step's cost depends on the text too (an n-gram drafter fills its
  budget on copy and not on chat), and a stale cost that makes an arm look worse is never revisited.
* Batch-normalized costs (``batch_normalized_costs``, opt-in): a bucket holds several batch sizes
  (5-8 in the bucket of 8), and per request a step of a filling or draining batch costs more at any
  K; such a step enters the windows as the bucket's full batch would have shared its fixed cost
  (``BucketState.at_bucket_batch``), so an arm that caught a drain does not read dear for good.
* Visit value (``visit_value``): past warm-up, an exploration or a firm-up goes ahead only when what
  the arm may gain over the steps the regime is expected to last outweighs the visit's cost
  (``_worth_a_visit``). A short regime is no place for four steps on a clear loser, and a long one
  can afford a look at a near tie.

One more is for model drafters only (``sure_zero``), where every draft token is a forward of the
drafter: K>0 goes to 0 at once, past the step limit and before ``evidence_to_stop`` trials, when K=0
beats every K>0 even at the top of the first draft's plausible acceptance (``_drafting_surely_loses``).

Guard rails: those of every policy (``Policy.choose``: decisions only every ``control_interval``
steps of a bucket, "hold" in between, moves of at most ``max_gamma_step`` per decision, K capped by
the caller's ``max_feasible_gamma``, "infeasible" when that changes the choice), and a switch
between measured arms only when the best UCB score beats the current by ``hysteresis`` (relative)
or patiently (above). UCB score = mean + c * R_max * sqrt(2 ln(N+1) / n), N the bucket's stable
steps, n the arm's window count, R_max the best mean. Moves made for information (warm-up,
exploration) are undone without hysteresis.

Buckets: each bucket keeps its own current K, so the clamp applies between two decisions of the same
bucket and a batch that alternates between two sizes gets each size's K at once. A new bucket starts
at the K of its nearest populated neighbour (a draining tail does not restart from max_gamma). With
model guidance the acceptance model is shared anyway and the neighbour's cost curve stands in for
the slope until the new bucket has measured two arms; without it, the neighbour's measured rewards,
rescaled to the new bucket, serve as priors and warm-up becomes a local hill climb, not a sweep.

Decision reasons: warmup, prior (a new bucket's first K), explore (an unmeasured arm that may win),
firm-up (a thin contender visited again), exploit, hold, infeasible.
Memory: buckets x arms x window samples, whatever the run length.

Size: about 720 lines, an eighth of them this explanation; what is left is the one class, whose rules
(warm-up, exploration, thin contenders, visit value, patience, forgetting, bucket priors) all read and write the same
per-bucket arms; the parts that stand alone already live apart (online_config, prediction, window,
bucket_state, coverage).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from statistics import NormalDist
from typing import Any

from vspec_runtime.control.acceptance import AcceptanceStats
from vspec_runtime.control.base import Decision, Policy, StepFeedback, Target
from vspec_runtime.control.batch_acceptance import BatchAcceptance
from vspec_runtime.control.bucket_state import COST_LINE_MIN_VARIANCE, BucketState, bucket_summary
from vspec_runtime.control.coverage import CoverageTally
from vspec_runtime.control.online_config import OnlineConfig
from vspec_runtime.control.per_request import StepCostLine
from vspec_runtime.control.prediction import CostPrediction, predict_cost, predict_from_neighbour
from vspec_runtime.control.run_acceptance import RunAcceptance
from vspec_runtime.control.window import ArmWindow, bucket_of

__all__ = ["OnlineConfig", "OnlinePolicy"]

_STANDARD_NORMAL = NormalDist()
STEP_LINE_DECAY = 0.995  # about 200 stable steps
STEP_LINE_MIN_VARIANCE = 1.0  # tokens verified per step must spread this much (sd 1) to give a fixed cost


def upper_rate(rate: float, trials: float, z: float) -> float:
    """Upper end of a rate's plausible range, ``z`` standard errors up (Wilson's score interval,
    which stays inside [0, 1] and sane on a handful of trials, unlike rate + z * stderr)."""
    z2 = z * z
    centre = rate + z2 / (2.0 * trials)
    spread = z * math.sqrt(rate * (1.0 - rate) / trials + z2 / (4.0 * trials * trials))
    return min(1.0, (centre + spread) / (1.0 + z2 / trials))


class OnlinePolicy(Policy):
    """Chooses K per step by a bandit over measured goodput; see the module docstring."""

    name = "online"

    def __init__(self, config: OnlineConfig | None = None, **settings: Any) -> None:
        if config is None:
            config = OnlineConfig(**settings)
        elif settings:
            config = replace(config, **settings)
        self.config = config
        self.rules = config.k_rules()
        self.acceptance = AcceptanceStats(
            max(1, config.max_gamma),
            memory_requests=config.acceptance_memory_requests,
            stale_half_life_steps=config.acceptance_stale_half_life_steps,
        )
        # The batch's own E[K] is read from per-request step rates, which under runs chase every run
        # (a request's last ten steps): with the run model it is left out (run_acceptance.py).
        self.batch_acceptance = (
            BatchAcceptance(self.acceptance.max_positions)
            if config.batch_acceptance and not config.acceptance_runs
            else None
        )
        self.runs = (
            RunAcceptance(
                config.max_gamma,
                memory_requests=config.acceptance_memory_requests,
                stale_half_life_steps=config.acceptance_stale_half_life_steps,
            )
            if config.acceptance_runs
            else None
        )
        # The run model already counts how K cuts runs into steps; the tally would count it twice.
        weighted = config.coverage_weighting and not config.acceptance_runs
        self.coverage = CoverageTally(config.max_gamma) if weighted else None
        # The pooled rates as of the latest decision price the tally's tail past a fully accepted
        # budget: reading them every step would recompute the pooled model every step.
        self._tail_rates = self.acceptance.rates()
        self._buckets: dict[int, BucketState] = {}
        self._rng = random.Random(config.seed)
        self._steps = 0
        self._phase_changes_seen = 0
        self._running: tuple[int, int] | None = None  # (bucket, K) of the latest step
        # Step time against the tokens verified in it, over stable steps of every bucket and K: a step's
        # fixed cost is the machine's, whatever the batch (``batch_normalized_costs``). Batches of
        # every size give it a wide spread of tokens to fit on; its memory is a few hundred steps.
        self._step_line = StepCostLine(decay=STEP_LINE_DECAY, min_variance=STEP_LINE_MIN_VARIANCE)

    def choose(self, batch_size: int, max_feasible_gamma: int) -> Decision:
        """``Policy.choose``, once a bucket entered with another K running has decided whether to keep it."""
        self._carry_running_gamma(batch_size)
        decision = super().choose(batch_size, max_feasible_gamma)
        self._running = (decision.bucket, decision.gamma)
        return decision

    # -- the Policy interface --------------------------------------------------------------------

    def observe(self, feedback: StepFeedback) -> None:
        self._steps += 1
        if feedback.batch_size < 1:
            return
        # Every step, drafts or not: a step without any (K=0: vLLM schedules no draft tokens at all)
        # still ages the evidence of undrafted positions, so that sitting at K=0 drifts the model back
        # to its prior and makes a K>0 worth a look again. Skipping such steps froze it at K=0.
        drafted, accepted = feedback.acceptance_trials()
        self.acceptance.update(drafted, accepted)
        if self.coverage is not None and feedback.stable and feedback.gamma > 0:
            self.coverage.update(feedback.gamma, accepted, self._tail_rates)
        if self.batch_acceptance is not None:
            self.batch_acceptance.observe(feedback)
        if self.runs is not None:
            self.runs.observe(feedback)
        if not feedback.is_cost_sample(self.config.max_gamma):
            return
        bucket = self._bucket(feedback.batch_size)
        arm = bucket.arms.get(feedback.gamma)
        if arm is None:
            arm = bucket.arms[feedback.gamma] = ArmWindow(self.config.window)
        interval_ms = bucket.without_stall(feedback.interval_ms, feedback.batch_size)
        verified = feedback.batched_tokens or None  # 0: the caller did not say
        if self.config.batch_normalized_costs:
            self._step_line.observe(verified or feedback.batch_size, interval_ms)
            fixed = self._step_line.line()
            interval_ms = bucket.at_bucket_batch(interval_ms, feedback.batch_size, None if fixed is None else fixed[0])
        arm.add(feedback.batch_size, interval_ms, feedback.committed_tokens, self._steps, verified)
        if verified is not None and feedback.gamma > 0:
            bucket.cost_line.observe(verified / feedback.batch_size, interval_ms / feedback.batch_size)
        bucket.samples += 1

    def _forget_costs_after_a_phase_change(self) -> None:
        """When the acceptance model notices a new workload phase, every bucket forgets its arm costs.

        A step's cost depends on the text as well as on K: an n-gram drafter fills its budget on
        copy-like text and leaves most of it empty on chat, and context lengths move with the
        workload. Costs kept from the old phase mislead the new one. On the demo bench, chat@8 ran
        K = 5 at 0.70x the best fixed K because K = 0 was predicted from a K = 4 window measured on
        copy@8. Forgetting costs a few exploration steps per change, and the detector is quiet in a
        steady phase (no change in 2,000 steps of any steady simulator scenario).
        """
        self.acceptance.expected_committed_curve()  # a read runs the change detection
        if self.acceptance.phase_changes == self._phase_changes_seen:
            return
        self._phase_changes_seen = self.acceptance.phase_changes
        for bucket in self._buckets.values():
            bucket.forget_costs()
        if self.coverage is not None:
            self.coverage.clear()

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "model_guided": self.config.model_guided,
            "steps": self._steps,
            "buckets": {str(key): bucket_summary(bucket) for key, bucket in sorted(self._buckets.items())},
            "acceptance": self._acceptance_summary(),
        }

    def _acceptance_summary(self) -> dict[str, Any]:
        summary = self.acceptance.summary()
        if self.runs is not None:
            # What the decisions read: E[K] along runs, and the run-position rates behind it.
            summary["run_expected_committed"] = [round(value, 4) for value in self.runs.expected_committed_curve()]
            summary["run_rates"] = [round(rate, 4) for rate in self.runs.rates()[:16]]
        if self.coverage is not None:
            summary["coverage"] = self.coverage.summary()
        if self.batch_acceptance is not None:
            # What the decisions read: E[K] of the requests in the latest step.
            summary["batch_requests"] = len(self.batch_acceptance.batch)
            summary["batch_expected_committed"] = [round(value, 4) for value in self.expected_committed_curve()]
        return summary

    # -- introspection (tests, benchmarks, docs) -------------------------------------------------

    def bucket_state(self, batch_size: int) -> dict[str, Any] | None:
        bucket = self._buckets.get(bucket_of(batch_size))
        return None if bucket is None else bucket_summary(bucket)

    # -- buckets ---------------------------------------------------------------------------------

    def _carry_running_gamma(self, batch_size: int) -> None:
        """Hysteresis across buckets: a bucket entered with another K running adopts that K unless its
        estimates, as they stand now, say its own K is better by more than ``hysteresis``; a bucket
        that has measured nothing adopts it anyway.

        Each bucket keeps its own K, so a batch that hovers at a power of two (8, 9, 8, ...) would
        switch K at every crossing, and a bucket that only ever sees admission steps (never a cost
        sample) keeps its start K. Measured under Poisson arrivals (``simulate.continuous_load``):
        half of the switches came from crossings between near-tied buckets; with a batch
        alternating 8 and 9 every step, K went 2, 6, 2, 6 and lost 10% of the goodput. "Now"
        matters: the rewards a bucket kept from its last decision may predate a change of phase (a
        re-probe of a sticky K=0 finds good drafts in one bucket, and the next bucket, left at K=0
        with the old rewards, would end it).
        """
        if self._running is None:
            return
        key, running = self._running
        bucket = self._bucket(batch_size)
        if bucket.key == key or bucket.gamma == running:
            return
        if not bucket.samples:
            bucket.gamma = running  # nothing measured here: the running K is as good a start as any
            return
        estimates = self._estimates_now(bucket)
        own, carried = estimates.get(bucket.gamma), estimates.get(running)
        if own is not None and carried is not None and own <= carried * (1.0 + self.config.hysteresis):
            bucket.gamma = running

    def _estimates_now(self, bucket: BucketState) -> dict[int, float]:
        """What a decision of ``bucket`` would estimate for each K now (measured or predicted)."""
        low, high = self.rules.min_gamma, self.config.max_gamma
        measured = bucket.measured(low, high)
        if not measured:
            return {}
        if not self.config.model_guided:
            estimates = {gamma: arm.goodput_tokens_per_ms for gamma, arm in measured.items()}
            return {**bucket.neighbour_priors(estimates, low, high), **estimates}
        estimates, _, predicted = self._guided_estimates(bucket, measured, low, high)
        return {**estimates, **{gamma: point for gamma, (point, _) in predicted.items()}}

    def _bucket(self, batch_size: int) -> BucketState:
        key = bucket_of(batch_size)
        bucket = self._buckets.get(key)
        if bucket is None:
            neighbour = self._nearest_populated(key)
            if neighbour is not None:
                start = neighbour.gamma
            elif self.config.start_gamma is not None:
                start = self.config.start_gamma
            else:
                start = self.config.max_gamma
            bucket = self._buckets[key] = BucketState(key, start, neighbour)
        return bucket

    def _nearest_populated(self, key: int) -> BucketState | None:
        """The populated bucket closest in log2(batch); on a tie the larger (a draining batch)."""
        populated = [bucket for bucket in self._buckets.values() if bucket.samples]
        if not populated:
            return None
        distance = lambda bucket: (abs(bucket.key.bit_length() - key.bit_length()), -bucket.key)  # noqa: E731
        return min(populated, key=distance)

    # -- deciding --------------------------------------------------------------------------------

    def _target(self, bucket: BucketState, batch_size: int, current: int | None, low: int, high: int) -> Target:
        self._forget_costs_after_a_phase_change()
        bucket.visited.add(current)
        bucket.clip_stalls()
        measured = bucket.measured(low, high)
        if current not in measured:
            # Nothing to compare yet: measure the arm we are on first.
            first_reason = "prior" if bucket.neighbour is not None and not bucket.samples else "warmup"
            target, reason = current, first_reason if bucket.warming_up else "hold"
        elif self.config.model_guided:
            target, reason = self._guided_target(bucket, measured, current, low, high)
        else:
            target, reason = self._plain_target(bucket, measured, current, low, high)
        if target == 0 < current and self._drafting_surely_loses(bucket):
            # Every K>0 loses even if the first draft is as good as the evidence allows: go at once.
            return Target(0, reason, bucket.rewards, step_limited=False)
        if self._stops_on_thin_evidence(current, target):
            target, reason = current, "hold"  # K=0 ends the evidence: stop drafting on enough of it
        if bucket.gamma > high and target == high:
            # The cap, not the policy, set this K: the bucket ran above the cap and the move ends on
            # it. Only this policy relabels such decisions (the profile policy keeps its reason); the
            # label also keeps them out of the warm-up count.
            reason = "infeasible"
        return Target(target, reason, bucket.rewards)

    def _drafting_surely_loses(self, bucket: BucketState) -> bool:
        """Whether K=0 beats every K>0 of this decision's estimates even with the first draft's
        acceptance at the top of its plausible range (``noise_z`` standard errors above the rate).

        ``evidence_to_stop`` asks for a fixed number of trials before K=0, because at K=0 nothing
        drafts and nothing could correct a K=0 chosen on a few unlucky drafts. Where drafting is
        dear that number is dear too: at batch 1 with the demo's useless 8-layer drafter each of the
        16 trials is a step at 1.5x the target's cost, and the walk down from K=6 (a move of 2 per
        decision) took 12 such steps. When even the optimistic rate loses, fewer trials are enough,
        and so is one move: a drafter right 0 times in 8 is plausibly right at most 45% of the time
        (z = 2, the prior's weight included), and K=1 loses wherever one draft costs half a step. A
        cheap drafter (an n-gram probe costs a verified token or two) needs the rate bounded far
        lower, so its stops still wait for the evidence. K=0's estimate may be a prediction (the
        secant through the arms measured so far, as on the way down from K=6); once there, K=0 is
        measured like any arm and the usual rules bring K>0 back. Model-guided estimates only: the
        plain arms' rewards are no function of E[K].
        """
        rewards = bucket.rewards
        zero = rewards.get(0)
        if not (self.config.sure_zero and self.config.model_guided) or zero is None or len(rewards) < 2:
            return False
        rate, trials = self.acceptance.rate(1), self.acceptance.evidence(1)
        if rate <= 0.0 or trials <= 0.0:
            return False
        scale = upper_rate(rate, trials, self.config.noise_z) / rate  # every draft path goes through draft 1
        expected = self.expected_committed_curve()
        return all(
            reward * (1.0 + (expected[gamma] - 1.0) * scale) / expected[gamma] < zero
            for gamma, reward in rewards.items()
            if gamma > 0
        )

    def _stops_on_thin_evidence(self, current: int, target: int) -> bool:
        """Whether this move would reach K=0 (within one step limit) on fewer acceptance trials than
        ``evidence_to_stop``; a move toward 0 that stops short of it goes ahead."""
        max_step = self.rules.max_gamma_step
        reaches_zero = target == 0 < current and (max_step is None or current <= max_step)
        return reaches_zero and self.acceptance.evidence(1) < self.config.evidence_to_stop

    def _record(self, bucket: BucketState, gamma: int, reason: str) -> None:
        super()._record(bucket, gamma, reason)
        bucket.visited.add(gamma)
        if reason == "warmup":
            bucket.warmup_decisions += 1
        elif reason == "firm-up":
            bucket.firmed_up_at[gamma] = bucket.samples

    def _guided_target(
        self, bucket: BucketState, measured: dict[int, ArmWindow], current: int, low: int, high: int
    ) -> tuple[int, str]:
        estimates, margins, predicted = self._guided_estimates(bucket, measured, low, high)
        best_estimate = max(estimates.values())
        bucket.rewards = {**estimates, **{gamma: point for gamma, (point, _) in predicted.items()}}
        candidates = {
            gamma: optimistic
            for gamma, (_, optimistic) in predicted.items()
            if optimistic > best_estimate * (1.0 + self.config.explore_margin)
        }
        best_sd = self._relative_sd(margins[max(estimates, key=estimates.__getitem__)])
        if not bucket.warming_up:
            candidates = self._visits_that_pay(bucket, candidates, best_sd, lambda gamma: (
                predicted[gamma][0] / best_estimate - 1.0,
                self._relative_sd(predicted[gamma][1] / predicted[gamma][0] - 1.0),
            ))
        if candidates:
            bucket.exploring = True
            return self._argmax(candidates, current), "warmup" if bucket.warming_up else "explore"
        # Every arm that could win has been measured: warm-up is over. What is left is firming up
        # thin measurements of arms close to the best.
        bucket.warming_up = False
        heading = self._firm_up_under_way(bucket, measured, current)
        if heading is not None:
            bucket.exploring = True
            return heading, "firm-up"
        contenders = self._unsure_contenders(bucket, measured, estimates, margins, best_estimate, current)
        contenders = self._visits_that_pay(bucket, contenders, best_sd, lambda gamma: (
            estimates[gamma] / best_estimate - 1.0, self._relative_sd(margins[gamma])
        ))
        if contenders:
            bucket.exploring = True
            bucket.firm_up_heading = self._argmax(contenders, current)
            return bucket.firm_up_heading, "firm-up"
        return self._exploit(bucket, measured, estimates, current)

    def _firm_up_under_way(self, bucket: BucketState, measured: dict[int, ArmWindow], current: int) -> int | None:
        """The thin arm a firm-up set out for, while the step limit has not let it get there yet.

        A firm-up farther than ``max_gamma_step`` stops on an arm between, and that arm is measured
        instead, often one known well already. Left to the next decision, the move was undone there:
        under a server's steady chat@8 load the policy went K=0, 2, 0, 2, ... on every other
        decision, firming up a thin K=6 that the visits to K=2 never reached. So the move goes on to
        its arm, unless the arm firmed up meanwhile or the costs were forgotten."""
        heading = bucket.firm_up_heading
        enough = min(self.config.confident_samples, self.config.window)
        reached_or_firm = heading == current or heading not in measured or measured[heading].count >= enough
        if not self.config.firm_up_follow_through or heading is None or reached_or_firm:
            bucket.firm_up_heading = None
            return None
        return heading

    def _guided_estimates(
        self, bucket: BucketState, measured: dict[int, ArmWindow], low: int, high: int
    ) -> tuple[dict[int, float], dict[int, float], dict[int, tuple[float, float]]]:
        """Goodput now of the measured arms (today's E[K] over each arm's cost), their noise margins,
        and the point and optimistic predictions of the unmeasured arms in [low, high]."""
        expected = self.expected_committed_curve()
        costs = self._arm_costs(bucket, measured)
        estimates = {gamma: expected[gamma] / costs[gamma] for gamma in measured}
        margins = bucket.noise_margins(self.config.noise_z)
        return estimates, margins, self._predict_unmeasured(bucket, expected, costs, margins, low, high)

    def _arm_costs(self, bucket: BucketState, measured: dict[int, ArmWindow]) -> dict[int, float]:
        """Milliseconds per request-step of each measured arm: its own window's mean, or with
        ``token_costs`` the bucket's cost line at the tokens the arm verifies.

        Arms are measured at different times, the one we run now and the others when we last visited
        them, and a shared machine's speed wanders between the two: on the demo's chat@1, K=1 and K=0
        kept costs 4% and 22% above what they were, measured two rounds before the K=3 we then ran,
        and lost 4% for five rounds. What K changes in a step is how many tokens the target verifies
        (the step cost is close to linear in them on a CPU), and that count does not depend on the
        machine's speed. So the line, fitted on the latest ~50 steps of any K > 0, prices every such arm
        at today's speed from its own (speed-free) count. It needs steps that verified different counts:
        an n-gram drafter's fills vary step by step, an EAGLE head's do not, and without the spread
        (``StepCostLine.line`` is None) each arm keeps its own mean. Visits to other arms would give
        a spread too, but a line through costs of different K misprices them where verification is
        free below a knee (a GPU at small batch): the line is only used while the arm we run varies.
        K=0 is left out of the line and keeps its own window: a step that drafts pays for drafting
        whether or not it verifies more tokens (the proposer, the rejection sampler; a K=0 step skips
        them), and on the demo's chat@8 a line through K=0 and K>0 steps priced K=1 within 2-4% of
        K=0 where it ran 8% slower, and the policy kept visiting it (docs/benchmarks.md, run 11).
        """
        costs = {gamma: arm.ms_per_request_step for gamma, arm in measured.items()}
        line = bucket.cost_line.line() if self.config.token_costs and self._fills_vary(bucket) else None
        if line is None:
            return costs
        fixed_ms, per_token_ms = line
        for gamma, arm in measured.items():
            if gamma > 0:
                costs[gamma] = max(fixed_ms + per_token_ms * arm.verified_per_request_step, 1e-6)
        return costs

    def expected_committed_curve(self) -> list[float]:
        """E[K] for K = 0..max: along runs of copyable text (``acceptance_runs``), else of the
        requests in the batch (their own acceptance), else pooled; with ``coverage_weighting``, per
        token of the text covered (``coverage.py``)."""
        if self.runs is not None:
            return self.runs.expected_committed_curve()
        pooled = self.acceptance.expected_committed_curve()
        if self.batch_acceptance is None and self.coverage is None:
            return pooled
        rates = self.acceptance.rates()
        curve = pooled
        if self.batch_acceptance is not None:
            curve = self.batch_acceptance.expected_committed_curve(rates, pooled)
        if self.coverage is None:
            return curve
        self._tail_rates = rates
        factors = self.coverage.compression()
        if factors is None:
            return curve
        return [1.0 + (expected - 1.0) * factor for expected, factor in zip(curve, factors)]

    def _unsure_contenders(
        self,
        bucket: BucketState,
        measured: dict[int, ArmWindow],
        estimates: dict[int, float],
        margins: dict[int, float],
        best_estimate: float,
        current: int,
    ) -> dict[int, float]:
        """Thinly sampled arms that, within their noise, come within the hysteresis of the best, and
        have fewer than half the best arm's samples.

        The last condition keeps at least two thirds of the steps on the best arm while a near-tie is
        firmed up. Without it the best arm, itself thin, was a contender of the contender: on copy@1
        the policy alternated K=6, 5, 6, 5 for whole cells (45% of steps at K=5, 5% below K=6),
        because a short batch-1 cell never gives either arm ``confident_samples``.

        An arm firmed up before is a contender again only once the bucket measured a step since (any
        arm's): a visit that cannot be measured, because the step it drafts in admits requests or is
        verified in another bucket's step, would otherwise be repeated at every such step. On the
        offline bench every batch-8 round starts with its first request alone in the engine (the
        others arrive while it runs), and with a useless model drafter the batch-1 bucket firmed up
        K=1 there in four rounds of six, each time a drafter pass over the prompt and no sample.
        """
        enough = min(self.config.confident_samples, self.config.window)
        floor = best_estimate / (1.0 + self.config.hysteresis)
        best = max(estimates, key=estimates.__getitem__)
        best_count = measured[best].count
        return {
            gamma: estimates[gamma]
            for gamma, arm in measured.items()
            if gamma not in (current, best) and arm.count < enough and 2 * arm.count < best_count
            and bucket.firmed_up_at.get(gamma) != bucket.samples
            and estimates[gamma] * (1.0 + margins[gamma]) >= floor
        }

    def _visits_that_pay(
        self,
        bucket: BucketState,
        visits: dict[int, float],
        best_sd: float,
        lead_of: Callable[[int], tuple[float, float]],
    ) -> dict[int, float]:
        """The ``visits`` (arm -> estimate) worth their cost (all of them without ``visit_value``);
        ``lead_of(arm)`` is its (lead, standard error) as ``_worth_a_visit`` reads them."""
        if not self.config.visit_value:
            return visits
        return {gamma: value for gamma, value in visits.items() if self._worth_a_visit(bucket, *lead_of(gamma), best_sd)}

    def _relative_sd(self, margin: float) -> float:
        """An arm's noise margin (``noise_z`` standard errors, relative) as one standard error."""
        return margin / self.config.noise_z if self.config.noise_z > 0.0 else 0.0

    def _worth_a_visit(self, bucket: BucketState, lead: float, arm_sd: float, best_sd: float) -> bool:
        """Whether an information visit to an arm pays for itself.

        ``lead`` is the arm's estimate relative to the best's, minus one (-0.12: 12% behind), and the
        two standard errors say how far the truth may lie from it. The visit costs ``-lead`` per step
        for the ``control_interval`` steps of a decision; it gains the expected amount by which the
        arm truly beats the best (the positive part of a normal), on every step the regime has left.
        A regime's remaining length is guessed as its age (at least one window): a workload that has
        lasted long will likely last long, and a short one is no place to spend steps on a near-tie.
        Both sides are in steps of the best arm's goodput. On the demo's copy@1 the rules visited K=5
        (12% behind K=6, its two standard errors about 9%) for four steps in rounds of nine: over a
        32-step horizon the visit may gain 0.002 steps and costs 0.5. A real near-tie (1% behind, 3%
        standard error) may gain 0.24 and costs 0.04: still visited.
        """
        spread = math.hypot(arm_sd, best_sd)
        if spread <= 0.0:
            gain = max(lead, 0.0)
        else:
            z = lead / spread
            gain = spread * _STANDARD_NORMAL.pdf(z) + lead * _STANDARD_NORMAL.cdf(z)
        horizon = max(bucket.regime_age, self.config.window)
        return gain * horizon >= max(-lead, 0.0) * self.rules.control_interval

    @staticmethod
    def _fills_vary(bucket: BucketState) -> bool:
        """Whether the arm the bucket runs verifies varying token counts step by step (n-gram lookup)."""
        arm = bucket.arms.get(bucket.gamma)
        return arm is not None and arm.verified_variance() >= COST_LINE_MIN_VARIANCE

    def _predict_unmeasured(
        self,
        bucket: BucketState,
        expected: list[float],
        arm_costs: dict[int, float],
        margins: dict[int, float],
        low: int,
        high: int,
    ) -> dict[int, tuple[float, float]]:
        """Point and optimistic predicted goodput of every unmeasured arm in [low, high]."""
        costs = sorted(
            (gamma, arm_costs[gamma], arm_costs[gamma] / (1.0 + margin))
            for gamma, margin in margins.items()
            if gamma in arm_costs
        )
        neighbour_costs = bucket.neighbour_costs() if len(costs) == 1 else []
        predictions: dict[int, tuple[float, float]] = {}
        for gamma in range(low, high + 1):
            if gamma in margins:
                continue
            cost = self._predict_cost(bucket, gamma, costs, neighbour_costs)
            predictions[gamma] = (expected[gamma] / cost.point_ms, expected[gamma] / cost.optimistic_ms)
        return predictions

    def _predict_cost(
        self,
        bucket: BucketState,
        gamma: int,
        costs: list[tuple[int, float, float]],
        neighbour_costs: list[tuple[int, float]],
    ) -> CostPrediction:
        if neighbour_costs:
            # One arm of our own: the neighbour's curve is a better guess of the slope than none.
            distance = abs(bucket.key.bit_length() - bucket.neighbour.key.bit_length())
            return predict_from_neighbour(
                gamma,
                costs[0],
                neighbour_costs,
                slope_factor=2.0 ** max(1, distance),
                tolerance=self.config.prediction_tolerance,
            )
        return predict_cost(
            gamma,
            costs,
            prior_slope_fraction=self.config.prior_slope_fraction,
            tolerance=self.config.prediction_tolerance,
        )

    def _plain_target(
        self, bucket: BucketState, measured: dict[int, ArmWindow], current: int, low: int, high: int
    ) -> tuple[int, str]:
        estimates = {gamma: arm.goodput_tokens_per_ms for gamma, arm in measured.items()}
        priors = bucket.neighbour_priors(estimates, low, high)
        bucket.rewards = {**priors, **estimates}
        if bucket.warming_up:
            target = self._plain_warmup_target(bucket, estimates, priors, current, low, high)
            if target is not None:
                bucket.exploring = True
                return target, "warmup"
        return self._exploit(bucket, measured, estimates, current)

    def _plain_warmup_target(
        self,
        bucket: BucketState,
        estimates: dict[int, float],
        priors: dict[int, float],
        current: int,
        low: int,
        high: int,
    ) -> int | None:
        unmeasured = [gamma for gamma in range(low, high + 1) if gamma not in estimates]
        if bucket.neighbour is None:
            # The first bucket knows nothing: visit every arm, nearest first.
            return min(unmeasured, key=lambda gamma: (abs(gamma - current), gamma)) if unmeasured else None
        # An inherited bucket hill-climbs: check the arm the priors favour and the unmeasured
        # neighbours of the best arm, until the best is surrounded by measurements.
        everything = {**priors, **estimates}
        best = self._argmax(everything, current)
        if best not in estimates:
            return best
        frontier = [gamma for gamma in (best - 1, best + 1) if gamma in unmeasured]
        return min(frontier, key=lambda gamma: (abs(gamma - current), gamma)) if frontier else None

    def _exploit(
        self, bucket: BucketState, measured: dict[int, ArmWindow], estimates: dict[int, float], current: int
    ) -> tuple[int, str]:
        if bucket.warming_up or bucket.exploring:
            # Moves made for information are undone without hysteresis: go to the best measured.
            bucket.warming_up = False
            bucket.exploring = False
            bucket.target = self._argmax(estimates, current)
            return bucket.target, "exploit"
        scores = self._ucb_scores(bucket, measured, estimates)
        best = self._argmax(scores, current)
        if best == current:
            bucket.target = bucket.challenger = None
            return current, "hold"
        # The hysteresis gates the start of a switch; once a clamped move is under way it goes on
        # while its target stays the best, or it would stop on an intermediate arm just inside the
        # hysteresis band.
        if best == bucket.target or scores[best] > scores[current] * (1.0 + self.config.hysteresis):
            bucket.target, bucket.challenger = best, None
            return best, "exploit"
        bucket.target = None
        if best != bucket.challenger:
            bucket.challenger, bucket.challenger_streak = best, 0
        bucket.challenger_streak += 1
        if self.config.patience_decisions and bucket.challenger_streak >= self.config.patience_decisions:
            bucket.target, bucket.challenger = best, None
            return best, "exploit"
        return current, "hold"

    def _ucb_scores(
        self, bucket: BucketState, measured: dict[int, ArmWindow], estimates: dict[int, float]
    ) -> dict[int, float]:
        reward_scale = max(estimates.values())
        log_term = 2.0 * math.log(bucket.samples + 1)
        bonus = self.config.exploration * reward_scale
        return {
            gamma: estimates[gamma] + bonus * math.sqrt(log_term / measured[gamma].count) for gamma in estimates
        }

    def _argmax(self, values: dict[int, float], current: int) -> int:
        """Highest value; ties go to the arm nearest the current one, then to a seeded coin."""
        top = max(values.values())
        tied = [gamma for gamma, value in values.items() if value >= top]
        if len(tied) == 1:
            return tied[0]
        nearest = min(abs(gamma - current) for gamma in tied)
        tied = sorted(gamma for gamma in tied if abs(gamma - current) == nearest)
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)
