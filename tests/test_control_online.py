"""OnlinePolicy against the seeded simulator: the issue's acceptance criteria and the guard rails.

Every run is seeded and uses common random numbers (simulate.py), so the numbers below are exact
for this code; the bounds leave room for honest tuning, not for luck.
"""

from __future__ import annotations

import json

import pytest

from vspec_runtime.control.base import StepFeedback
from vspec_runtime.control.online import OnlineConfig, OnlinePolicy, upper_rate
from vspec_runtime.control.simulate import (
    AcceptanceProcess,
    LatencyModel,
    Scenario,
    batch_dependent,
    copy_runs,
    goodput_curve,
    goodput_ratio,
    high_acceptance,
    phase_change,
    run,
    steps_to_readapt,
    useless_drafter,
    wandering_machine,
    wandering_ngram,
    workload_shift,
)
from vspec_runtime.control.static import FixedPolicy

CRITERIA_SCENARIOS = {
    "a-high-acceptance": high_acceptance,
    "b-useless-drafter": useless_drafter,
    "c-batch-dependent": batch_dependent,
    "d-phase-change": phase_change,
    "d-phase-change-rising": lambda: phase_change(high_first=False),
}


def policy(**settings) -> OnlinePolicy:
    return OnlinePolicy(max_gamma=settings.pop("max_gamma", 6), **settings)


def feedback(batch: int, gamma: int, accepted: int, interval_ms: float = 20.0, stable: bool = True) -> StepFeedback:
    return StepFeedback(
        batch_size=batch,
        gamma=gamma,
        drafted=(gamma,) * batch,
        accepted=(min(accepted, gamma),) * batch,
        interval_ms=interval_ms,
        stable=stable,
    )


# -- the acceptance criteria: >= 98% of the oracle over 2,000 steps ---------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CRITERIA_SCENARIOS))
def test_goodput_is_within_two_percent_of_the_best_k(name, seed):
    scenario = CRITERIA_SCENARIOS[name]()
    ratio, result = goodput_ratio(policy(seed=seed), scenario, seed=seed)
    print(f"{name} seed={seed}: {ratio:.4f} of the oracle, {result.switches} switches")
    assert ratio >= 0.98


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wandering_machine_costs_a_few_percent_at_most(seed):
    # A known loss, bounded: arms compared across time on a machine whose speed wanders by 10% (the
    # demo's chat@1 on this 2-core machine). 0.967-0.993x over six seeds when this was written.
    scenario = wandering_machine()
    online = run(policy(seed=seed), None, scenario, seed=seed).goodput_tokens_per_ms
    fixed = [run(FixedPolicy(gamma), None, scenario, seed=seed).goodput_tokens_per_ms for gamma in range(7)]
    assert online >= 0.95 * max(fixed)


@pytest.mark.parametrize("batch", [1, 8])
def test_token_costs_price_arms_at_todays_speed_on_a_wandering_machine(batch):
    # n-gram-like fills on a machine whose speed wanders: arms priced by their own windows carry the
    # speed of the spell they were measured in; the cost line over verified tokens prices them at today's.
    scenario = wandering_ngram(batch=batch)
    seeds = range(4)
    with_line = [run(policy(seed=seed), None, scenario, seed=seed).goodput_tokens_per_ms for seed in seeds]
    own_windows = [run(policy(seed=seed, token_costs=False), None, scenario, seed=seed).goodput_tokens_per_ms
                   for seed in seeds]
    assert sum(with_line) > 1.004 * sum(own_windows), f"{with_line} vs {own_windows}"
    for seed, goodput in zip(seeds[:2], with_line):
        best_fixed = max(run(FixedPolicy(gamma), None, scenario, seed=seed).goodput_tokens_per_ms for gamma in range(7))
        assert goodput >= 0.98 * best_fixed, f"seed {seed}: {goodput / best_fixed:.3f} of the best fixed K"


def test_token_costs_leave_arms_that_always_fill_to_their_own_windows():
    # EAGLE-like drafters fill every budget: the running arm verifies one count, and a line through
    # other arms' visits would misprice them past a knee. The two settings must then decide alike.
    scenario = batch_dependent(1000)
    with_line, own_windows = run(policy(seed=0), None, scenario), run(policy(seed=0, token_costs=False), None, scenario)
    assert with_line.gammas == own_windows.gammas


@pytest.mark.parametrize("high_first", [True, False])
def test_readapts_after_a_phase_change(high_first):
    scenario = phase_change(high_first=high_first)
    for seed in range(3):
        _, result = goodput_ratio(policy(seed=seed), scenario, seed=seed)
        steps = steps_to_readapt(result, scenario, change_step=scenario.steps // 2)
        print(f"phase change (high_first={high_first}) seed={seed}: re-adapted in {steps} steps")
        assert steps is not None and steps <= 120


@pytest.mark.parametrize("seed", range(6))
def test_forgets_step_costs_measured_on_another_workload(seed):
    # Bench order copy@1, copy@8, chat@1, chat@8; chat@8's best is K = 1, which cost more during
    # copy@8 (the drafter filled its budget there). Without forgetting, seed 0 sat at K = 0 for 296
    # of chat@8's 300 steps.
    scenario = workload_shift(cell_steps=300)
    result = run(policy(seed=seed), None, scenario, seed=seed)
    chat_at_8 = result.gammas[900:]
    assert scenario.best_gamma(900) == 1
    assert chat_at_8.count(1) >= 0.8 * len(chat_at_8), {k: chat_at_8.count(k) for k in set(chat_at_8)}


def test_batch_dependent_runs_each_buckets_own_best():
    scenario = batch_dependent()
    online = policy()
    result = run(online, None, scenario)
    # The last phase is batch 8 (best K = 1), the one before batch 1 (best K = 6).
    assert result.gammas[-1] == 1
    assert result.gammas[scenario.steps - 251] == 6
    assert online.bucket_state(1)["gamma"] == 6
    assert online.bucket_state(8)["gamma"] == 1


# -- exploration cost: model guidance visits fewer arms ---------------------------------------------


@pytest.mark.parametrize("scenario_factory", [high_acceptance, useless_drafter])
def test_model_guidance_explores_fewer_arms_than_plain_warmup(scenario_factory):
    scenario = scenario_factory()
    guided = run(policy(model_guided=True), 200, scenario)
    plain = run(policy(model_guided=False), 200, scenario)
    assert guided.arms_visited() < set(range(7)) == plain.arms_visited()
    assert len(guided.arms_visited()) <= 5
    assert guided.goodput_tokens_per_ms > plain.goodput_tokens_per_ms


def test_high_acceptance_never_tries_short_drafts():
    result = run(policy(), None, high_acceptance())
    assert min(result.gammas) >= 4  # 0..3 are ruled out by prediction, never run


def test_useless_drafter_settles_at_zero():
    result = run(policy(), None, useless_drafter())
    assert result.gammas[-1] == 0
    assert result.gammas[100:].count(0) / len(result.gammas[100:]) > 0.9


# -- golden values ------------------------------------------------------------------------------------


def decisions(result, limit: int) -> list[tuple[int, int, str]]:
    return [(step, gamma, reason) for step, (gamma, reason) in enumerate(zip(result.gammas, result.reasons))
            if reason != "hold"][:limit]


def test_golden_decisions_high_acceptance():
    result = run(policy(seed=0), 60, high_acceptance(), seed=0)
    # Back to K=6 after warm-up is "exploit": the best arm is not a contender of a contender.
    assert decisions(result, 4) == [(0, 6, "warmup"), (4, 4, "warmup"), (8, 5, "warmup"), (12, 6, "exploit")]
    assert result.gammas[-1] == 6


def test_golden_decisions_useless_drafter():
    result = run(policy(seed=0), 60, useless_drafter(), seed=0)
    assert decisions(result, 7) == [
        (0, 6, "warmup"),
        (4, 4, "warmup"),
        (8, 2, "warmup"),
        (12, 0, "warmup"),
        (16, 1, "warmup"),
        (20, 0, "exploit"),  # the best measured arm: no longer visited as a contender first
    ]


def dear_useless_drafter(draft_ms: float = 22.0) -> Scenario:
    """The demo's useless drafter at batch 1, as measured (docs/benchmarks.md): SmolLM2 drafted by its
    own first 8 layers, a step of 44 ms at K=0 and 66 at K=1, one draft in twelve accepted."""
    return Scenario("dear-useless", AcceptanceProcess.constant(0.08),
                    LatencyModel(base_ms=44.0, verify_ms_per_token=0.0, draft_ms_per_forward=draft_ms),
                    batches=((0, 1),), steps=400, unstable_rate=0.0)


def test_a_dear_drafter_that_surely_loses_goes_to_k0_at_once():
    """With sure_zero (model drafters) the walk down from K=6 stops as soon as even the most
    optimistic first-draft rate loses to K=0, past the step limit and before evidence_to_stop trials:
    the 8-layer drafter's first round walked 6, 4, 2, 0 at up to 3.7x the target's step."""
    walking = run(policy(seed=0), None, dear_useless_drafter(), seed=0)
    sure = run(policy(seed=0, sure_zero=True), None, dear_useless_drafter(), seed=0)
    assert decisions(sure, 3) == [(0, 6, "warmup"), (4, 4, "warmup"), (8, 0, "warmup")]
    assert decisions(walking, 3) == [(0, 6, "warmup"), (4, 4, "warmup"), (8, 2, "warmup")]
    drafting = lambda result: sum(gamma > 0 for gamma in result.gammas[:100])  # noqa: E731
    assert drafting(sure) == 8 < drafting(walking)
    assert sure.goodput_tokens_per_ms > walking.goodput_tokens_per_ms


def test_a_low_start_k_learns_a_dear_useless_drafter_for_less():
    """``start_gamma``: the engine's first decisions run at that K. Where every draft is a dear step
    and rarely right, learning it from K=1 drafts once a step instead of six times: the same answer
    (K=0) for less drafting time than the walk down from K=6."""
    from_max = run(policy(seed=0, sure_zero=True), None, dear_useless_drafter(), seed=0)
    from_one = run(policy(seed=0, sure_zero=True, start_gamma=1), None, dear_useless_drafter(), seed=0)
    assert decisions(from_one, 1) == [(0, 1, "warmup")]
    assert from_one.gammas[-200:] == from_max.gammas[-200:] == [0] * 200
    drafted = lambda result: sum(result.gammas)  # noqa: E731 - draft forwards, one per drafted token at batch 1
    assert drafted(from_one) < drafted(from_max)
    assert from_one.goodput_tokens_per_ms > from_max.goodput_tokens_per_ms


def test_a_cheap_drafter_still_waits_for_the_evidence_to_stop():
    """Where a draft costs 1% of a step (an n-gram probe verifies a token or two), the optimistic rate
    never loses on a handful of trials: K=0 comes after evidence_to_stop trials, as without the rule."""
    online = policy(seed=0, sure_zero=True)
    result = run(online, None, dear_useless_drafter(draft_ms=0.4), seed=0)
    first_zero = result.gammas.index(0)
    assert sum(gamma > 0 for gamma in result.gammas[:first_zero]) >= online.config.evidence_to_stop


def test_the_plausible_rate_bound_widens_on_few_trials_and_stays_a_probability():
    assert upper_rate(0.1, 8.0, 2.0) == pytest.approx(0.452, abs=0.001)  # 0 of 8, the prior included
    assert upper_rate(0.1, 8.0, 2.0) > upper_rate(0.1, 80.0, 2.0) > 0.1
    assert upper_rate(0.999, 1.0, 2.0) <= 1.0


def test_same_seed_same_choices():
    first = run(policy(seed=7), 500, batch_dependent(), seed=7)
    second = run(policy(seed=7), 500, batch_dependent(), seed=7)
    assert first.gammas == second.gammas and first.reasons == second.reasons


# -- guard rails --------------------------------------------------------------------------------------


def near_tie() -> Scenario:
    """K = 5 and K = 6 within 0.1% of each other; everything else clearly worse."""
    return Scenario("near-tie", AcceptanceProcess.constant(0.9), LatencyModel(draft_ms_per_forward=5.07))


def test_near_tie_is_really_a_tie():
    scenario = near_tie()
    curve = goodput_curve(scenario.acceptance.probabilities(0), scenario.latency, 4, range(7))
    assert abs(curve[5] / curve[6] - 1.0) < 0.002
    assert max(curve[k] for k in range(5)) < 0.99 * curve[6]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hysteresis_does_not_flap_between_near_equal_arms(seed):
    result = run(policy(seed=seed), None, near_tie(), seed=seed)
    settled = result.gammas[200:]
    changes = sum(1 for before, after in zip(settled, settled[1:]) if before != after)
    assert changes <= 6
    assert set(settled) <= {4, 5, 6}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thin_contenders_are_firmed_up_then_left_alone(seed):
    """Near-tied arms measured on a few steps are visited again ("firm-up", apart from "explore" of
    unmeasured arms, so a trace says which rule spent the steps), and only until they are firm."""
    result = run(policy(seed=seed), None, near_tie(), seed=seed)
    firm_ups = [step for step, reason in enumerate(result.reasons) if reason == "firm-up"]
    assert firm_ups, "a near tie on thin windows must be firmed up"
    assert all(result.gammas[step] in result.gammas[:step] for step in firm_ups), "firm-up visits measured arms"
    assert max(firm_ups) < 400, f"still firming up at step {max(firm_ups)} of a steady scenario"


class FirmUpWatcher(OnlinePolicy):
    """Records every decision (not holds) with the samples its arm already had."""

    def __init__(self, **settings):
        super().__init__(max_gamma=6, **settings)
        self.decisions: list[tuple[int, int, str, int]] = []  # bucket, K, reason, samples of K's arm

    def choose(self, batch_size: int, max_feasible_gamma: int):
        decision = super().choose(batch_size, max_feasible_gamma)
        if decision.reason != "hold":
            arm = self.bucket_state(batch_size)["arms"].get(str(decision.gamma))
            self.decisions.append((decision.bucket, decision.gamma, decision.reason, arm["samples"] if arm else 0))
        return decision

    def undone_firm_ups(self) -> int:
        """Firm-ups that stopped on a well-measured arm on their way and were undone at the next decision."""
        undone = 0
        for bucket in {entry[0] for entry in self.decisions}:
            mine = [entry for entry in self.decisions if entry[0] == bucket]
            for before, firm_up, after in zip(mine, mine[1:], mine[2:]):
                passing = firm_up[2] == "firm-up" and firm_up[3] >= self.config.confident_samples
                if passing and after[2] == "exploit" and (after[1] - firm_up[1]) * (firm_up[1] - before[1]) < 0:
                    undone += 1
        return undone


@pytest.mark.parametrize("scenario", [lambda: wandering_ngram(batch=8), lambda: copy_runs(batch=8),
                                      lambda: wandering_machine(batch=1)])
@pytest.mark.parametrize("seed", [0, 2])
def test_a_firm_up_goes_on_to_the_thin_arm_it_is_for(scenario, seed):
    """A firm-up farther than one move (``max_gamma_step``) stops on an arm between, one measured well
    already; the next decision used to undo it, and the one after made it again: steps spent, nothing
    learnt (K=0, 2, 0, 2, ... under a server's steady chat@8 load). With ``firm_up_follow_through``
    (opt-in) it goes on to its arm."""
    watcher = FirmUpWatcher(seed=seed, firm_up_follow_through=True)
    run(watcher, None, scenario(), seed=seed)
    assert any(entry[2] == "firm-up" for entry in watcher.decisions), "these scenarios have near ties"
    assert watcher.undone_firm_ups() == 0
    without = FirmUpWatcher(seed=seed, firm_up_follow_through=False)
    run(without, None, scenario(), seed=seed)
    assert without.undone_firm_ups() > 0, "the scenario no longer shows what this test is about"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_visit_value_still_firms_up_a_real_near_tie(seed):
    """With ``visit_value`` an information visit must pay for itself; an arm within 0.1% of the best,
    measured on a few steps, does (it may well be the better one), so it is still firmed up."""
    result = run(policy(seed=seed, visit_value=True), None, near_tie(), seed=seed)
    assert "firm-up" in result.reasons


def test_no_hysteresis_no_patience_flaps_more():
    steady = run(policy(seed=0), None, near_tie(), seed=0)
    twitchy = run(policy(seed=0, hysteresis=0.0, patience_decisions=1), None, near_tie(), seed=0)
    assert twitchy.switches > steady.switches


@pytest.mark.parametrize("interval", [1, 3, 8])
def test_decisions_only_every_control_interval(interval):
    result = run(policy(control_interval=interval), 400, useless_drafter())
    decision_steps = [step for step, reason in enumerate(result.reasons) if reason != "hold"]
    assert decision_steps and all(step % interval == 0 for step in decision_steps)
    changes = [step for step in range(1, 400) if result.gammas[step] != result.gammas[step - 1]]
    assert all(step % interval == 0 for step in changes)


@pytest.mark.parametrize("max_step", [1, 2, 3])
def test_moves_are_clamped_to_max_gamma_step(max_step):
    result = run(policy(max_gamma_step=max_step), 600, useless_drafter())  # wants 6 -> 0
    moves = [abs(after - before) for before, after in zip(result.gammas, result.gammas[1:])]
    assert max(moves) == max_step
    assert result.gammas[-1] == 0


def test_infeasible_cap_overrides_the_choice():
    online = policy()
    decision = online.choose(batch_size=4, max_feasible_gamma=2)
    assert (decision.gamma, decision.reason) == (2, "infeasible")  # wanted its start, max_gamma = 6
    for _ in range(3):
        assert online.choose(4, 2).gamma <= 2
        online.observe(feedback(4, 2, accepted=2))
    assert online.choose(4, 6).gamma <= 6


def test_infeasible_cap_limits_exploration():
    scenario = Scenario("capped", AcceptanceProcess.constant(0.9), LatencyModel(), max_num_batched_tokens=16)
    result = run(policy(), 300, scenario)  # 16 // 4 - 1 = 3
    assert max(result.gammas) <= 3
    assert result.gammas[-1] == 3


def test_min_gamma_is_respected():
    result = run(policy(min_gamma=2), None, useless_drafter())
    assert min(result.gammas) == 2
    assert result.gammas[-1] == 2


def test_unstable_steps_do_not_count_toward_rewards():
    online = policy()
    online.choose(4, 6)
    online.observe(feedback(4, 6, accepted=6, stable=False))
    assert online.bucket_state(4)["stable_steps"] == 0
    assert online.acceptance.evidence(1) > 0  # but acceptance still learns from them
    online.observe(feedback(4, 6, accepted=6, interval_ms=float("nan")))
    assert online.bucket_state(4)["stable_steps"] == 0


def test_k0_feedback_is_an_arm_like_any_other():
    online = policy(control_interval=1)
    online.choose(2, 6)
    online.observe(feedback(2, 0, accepted=0, interval_ms=10.0))
    arms = online.bucket_state(2)["arms"]
    assert arms["0"]["samples"] == 1
    assert arms["0"]["goodput_tokens_per_ms"] == pytest.approx(0.2)  # batch / interval


def test_decide_next_turns_a_hold_into_a_decision():
    online = policy(control_interval=8)
    online.choose(4, 6)
    online.observe(feedback(4, 6, accepted=6))
    assert online.choose(4, 6).reason == "hold"
    online.decide_next(4)
    online.choose(4, 6)
    assert online.bucket_state(4)["decisions"] == 2


# -- K=0: what it takes to go there, and to come back -----------------------------------------------


def test_acceptance_ages_back_to_its_prior_while_nothing_drafts():
    """At K=0 vLLM schedules no draft tokens, so the steps carry no drafts at all; they must still age
    the old evidence, or a K=0 chosen in a bad phase would never look worth leaving."""
    online = policy()
    for _ in range(50):
        online.observe(feedback(8, 2, accepted=0))
    low = online.acceptance.rate(1)
    for _ in range(1000):  # evidence halves every 64 steps without drafts
        online.observe(StepFeedback(batch_size=8, gamma=0, drafted=(), accepted=(), interval_ms=20.0, stable=True))
    assert low < 0.1 and online.acceptance.rate(1) > 0.45


def probe_under_load(online: OnlinePolicy, steps: int, drafting: int) -> list[int]:
    """K chosen per step while ``drafting`` of 8 requests draft and have every draft rejected, the others
    unable to draft (a re-probe of a sticky K=0: only requests that arrived since can); K=0 costs 20 ms
    a step, each draft token 5 ms more."""
    chosen = []
    for _ in range(steps):
        gamma = online.choose(8, 6).gamma
        chosen.append(gamma)
        ids = tuple("abcdefgh")
        online.observe(StepFeedback(
            batch_size=8, gamma=gamma, drafted=(gamma,) * drafting if gamma else (),
            accepted=(0,) * drafting if gamma else (), interval_ms=20.0 + 5.0 * gamma, stable=True,
            batch_ids=ids, request_ids=ids[8 - drafting:] if gamma else (), cannot_draft=ids[:8 - drafting]))
    return chosen


@pytest.mark.parametrize("sure_zero", [False, True])
def test_does_not_stop_drafting_on_a_few_rejected_drafts(sure_zero):
    """A re-probe under load drafts only for the requests that arrived since the cohort began: a
    rejected draft or two must not end it (at K=0 nothing drafts, so nothing could correct it), a
    batch's worth may. With sure_zero too: here a draft costs a quarter of a step, and ten rejected
    drafts leave a rate up to a third plausible, at which K=1 still pays."""
    thin = probe_under_load(policy(control_interval=1, start_gamma=2, sure_zero=sure_zero), 10, drafting=1)
    assert min(thin) > 0, thin
    hasty = probe_under_load(policy(control_interval=1, start_gamma=2, evidence_to_stop=0), 10, drafting=1)
    assert hasty[-1] == 0, "without the rule the same probe ends on a few drafts (the test would prove nothing)"
    full = probe_under_load(policy(control_interval=1, start_gamma=2, sure_zero=sure_zero), 10, drafting=8)
    assert full[-1] == 0, full


def test_requests_that_cannot_draft_are_no_failures():
    step = StepFeedback(batch_size=4, gamma=3, drafted=(3,), accepted=(3,), interval_ms=10.0, stable=True,
                        batch_ids=("a", "b", "c", "d"), request_ids=("d",), cannot_draft=("a", "b"))
    assert step.acceptance_trials() == ((3, 3), (3, 0))  # d accepted all; c drafted nothing: a failure


# -- buckets and prior transfer ---------------------------------------------------------------------


def drain() -> Scenario:
    """A draining batch: 8 requests, then 4 (same acceptance, verification compute-bound above 16 tokens)."""
    return Scenario(
        "drain",
        AcceptanceProcess.constant(0.8),
        LatencyModel(verify_ms_per_token=0.05, knee_tokens=16, draft_ms_per_forward=0.3),
        batches=((0, 8), (500, 4)),
        steps=1000,
    )


@pytest.mark.parametrize("guided", [True, False])
def test_new_bucket_inherits_instead_of_restarting_warmup(guided):
    scenario = drain()
    online = policy(model_guided=guided)
    result = run(online, None, scenario)
    first, second = online.bucket_state(8), online.bucket_state(4)
    assert second["inherited_from"] == 8
    assert (result.gammas[500], result.reasons[500]) == (first["gamma"], "prior")
    fresh = policy(model_guided=guided)
    run(fresh, 500, Scenario("fresh-4", scenario.acceptance, scenario.latency, batches=((0, 4),)))
    assert second["warmup_decisions"] < fresh.bucket_state(4)["warmup_decisions"]
    assert len(second["arms_visited"]) <= len(fresh.bucket_state(4)["arms_visited"])


def test_nearest_populated_bucket_is_the_prior():
    online = policy(control_interval=1)
    for batch, gamma in ((1, 6), (32, 2)):
        online.choose(batch, 6)
        online.observe(feedback(batch, gamma, accepted=1))
    assert online.choose(16, 6).bucket == 16
    assert online.bucket_state(16)["inherited_from"] == 32  # 16 is one power of two from 32, four from 1


def test_bucket_count_and_window_are_bounded():
    online = policy(window=8, control_interval=1)
    for step in range(3000):
        batch = 1 + step % 64
        decision = online.choose(batch, 6)
        online.observe(feedback(batch, decision.gamma, accepted=step % 3))
    summary = online.summary()
    assert sorted(int(key) for key in summary["buckets"]) == [1, 2, 4, 8, 16, 32, 64]
    for bucket in summary["buckets"].values():
        assert all(arm["samples"] <= 8 for arm in bucket["arms"].values())


# -- configuration and summary ----------------------------------------------------------------------


def test_summary_is_json():
    online = policy()
    run(online, 300, batch_dependent())
    text = json.dumps(online.summary(), allow_nan=False)
    assert '"policy": "online"' in text


@pytest.mark.parametrize(
    "settings",
    [{"max_gamma": -1}, {"min_gamma": 7}, {"max_gamma_step": 0}, {"control_interval": 0}, {"window": 0},
     {"hysteresis": -0.1}, {"exploration": float("inf")}, {"start_gamma": 9}, {"patience_decisions": -1}],
)
def test_config_rejects_bad_settings(settings):
    with pytest.raises(ValueError, match="online policy"):
        OnlineConfig(**{"max_gamma": 6, **settings})


def test_config_from_settings():
    from vspec_runtime.spec import AdaptiveSettings

    adaptive = AdaptiveSettings(min_gamma=1, max_gamma_step=3, control_interval=2, hysteresis=0.1,
                                online_window=16, online_exploration=0.5, model_guided=False, seed=4)
    config = OnlineConfig.from_settings(adaptive, max_gamma=5)
    assert (config.max_gamma, config.min_gamma, config.max_gamma_step, config.control_interval) == (5, 1, 3, 2)
    assert (config.hysteresis, config.window, config.exploration, config.model_guided, config.seed) == (
        0.1, 16, 0.5, False, 4)


@pytest.mark.parametrize(("method", "sure"), [("ngram", False), ("draft", True), ("eagle", True), ("eagle3", True)])
def test_the_sure_k0_is_for_model_drafters(method, sure):
    from vspec_runtime.spec import AdaptiveSettings

    assert OnlineConfig.from_settings(AdaptiveSettings(enabled=True), 6, method).sure_zero is sure


def test_zero_max_gamma_always_runs_zero():
    result = run(policy(max_gamma=0), 50, high_acceptance())
    assert set(result.gammas) == {0}


def test_acceptance_counts_an_unfilled_budget_as_failures():
    """n-gram lookup often proposes nothing: a budget K must be judged by what it commits per request."""
    step = StepFeedback(batch_size=4, gamma=6, drafted=(6, 2), accepted=(6, 1), interval_ms=10.0, stable=True)
    assert step.acceptance_trials() == ((6, 6, 6, 6), (6, 1, 0, 0))
    prefill = StepFeedback(batch_size=4, gamma=6, drafted=(6, 2), accepted=(6, 1), interval_ms=10.0, stable=False)
    assert prefill.acceptance_trials() == ((6, 2), (6, 1))

    policy = OnlinePolicy(max_gamma=4, min_gamma=0)
    for _ in range(300):
        # half of the requests find a match and it is always right; the other half propose nothing
        policy.observe(StepFeedback(batch_size=2, gamma=4, drafted=(4,), accepted=(4,), interval_ms=10.0, stable=True))
    expected = policy.acceptance.expected_committed_curve()
    assert expected[4] == pytest.approx(3.0, abs=0.15)  # 1 + 0.5 * 4, not the 5 of the drafts made


def test_a_firm_up_that_cannot_be_measured_is_not_repeated_until_the_bucket_measures_again():
    """A firm-up drafts in a step that may yield no cost sample (it admits requests, or its drafts are
    verified in another bucket's step): on the offline bench every batch-8 round began with its first
    request alone, and the batch-1 bucket firmed up K=1 there round after round, each time a drafter
    pass and no sample. Each arm's visit is made once; once steps are measured again, so are visits."""
    batch = near_tie().batches[0][1]
    firm_up_steps = [step for step, reason in enumerate(run(policy(seed=0), None, near_tie(), seed=0).reasons)
                     if reason == "firm-up"]
    assert firm_up_steps
    online = policy(seed=0)
    run(online, firm_up_steps[0], near_tie(), seed=0)  # the state just before the first firm-up

    def unmeasured_firm_ups(steps: int) -> list[int]:
        visited = []
        for _ in range(steps):
            decision = online.choose(batch, 6)
            if decision.reason == "firm-up":
                visited.append(decision.gamma)
            online.observe(feedback(batch, decision.gamma, accepted=decision.gamma, stable=False))
        return visited

    unmeasured = unmeasured_firm_ups(40 * online.rules.control_interval)
    assert unmeasured, "the near tie is firmed up"
    assert len(unmeasured) == len(set(unmeasured)), f"a firm-up nobody measured was repeated: {unmeasured}"
    measured = run(online, 200, near_tie(), seed=0)  # the simulator's steps are measured
    assert "firm-up" in measured.reasons, "measured steps did not make the thin arms contenders again"


def test_a_smaller_batch_in_a_bucket_is_priced_as_the_buckets_full_batch():
    """batch_normalized_costs: a step of 5 requests in the bucket of 8 carries 3/8 of its fixed cost
    less, as eight requests would have shared it; a full batch, or an unknown fixed cost, is left as
    measured, and the fixed part never exceeds the step."""
    from vspec_runtime.control.bucket_state import BucketState

    bucket = BucketState(8, 2, None)
    assert bucket.at_bucket_batch(80.0, 5, 40.0) == pytest.approx(80.0 - 40.0 * 3 / 8)
    assert bucket.at_bucket_batch(80.0, 8, 40.0) == 80.0
    assert bucket.at_bucket_batch(80.0, 5, None) == 80.0
    assert bucket.at_bucket_batch(30.0, 5, 40.0) == pytest.approx(30.0 - 30.0 * 3 / 8)


def test_batch_normalized_costs_learn_the_fixed_cost_from_steps_of_every_size():
    """The fixed cost a step's missing requests would have shared comes from a line of step time
    against tokens over every bucket's stable steps: with steps costing 40 ms + 2 ms a token, a drain
    step of 5 requests at K=0 (50 ms) enters the K=0 window of the bucket of 8 as 35 ms."""
    policy = OnlinePolicy(max_gamma=4, batch_normalized_costs=True)
    for step in range(60):
        batch = (2, 4, 8)[step % 3]
        policy.choose(batch, 4)
        gamma = step % 2
        tokens = batch * (gamma + 1)
        policy.observe(StepFeedback(batch, gamma, (gamma,) * batch if gamma else (), (0,) * batch if gamma else (),
                                    40.0 + 2.0 * tokens, True, batched_tokens=tokens))
    fixed, per_token = policy._step_line.line()
    assert fixed == pytest.approx(40.0, rel=0.01) and per_token == pytest.approx(2.0, rel=0.01)
    bucket = policy._bucket(5)
    before = bucket.arms[0].interval_ms if 0 in bucket.arms else 0.0
    policy.observe(StepFeedback(5, 0, (), (), 50.0, True, batched_tokens=5))
    assert bucket.arms[0].interval_ms - before == pytest.approx(50.0 - 40.0 * 3 / 8)
