"""AdaptiveController bookkeeping (pure Python): which K a verified step belongs to, interval timing,
stable-step detection, the sticky K=0 cohort, trace and samples files, and the metrics snapshot."""

from __future__ import annotations

import json

import pytest

from vspec_runtime.control.base import Decision, Policy, StepFeedback, Target
from vspec_runtime.control.rules import KRules
from vspec_runtime.control.sticky import MAX_BACKOFF, StickyZero
from vspec_runtime.controller import AdaptiveController, ObservedStep
from vspec_runtime.spec import validate_spec


class ScriptedPolicy(Policy):
    """Returns K from a script and records what it was told."""

    name = "scripted"

    def __init__(self, gammas):
        self.gammas = list(gammas)
        self.seen: list[StepFeedback] = []

    def choose(self, batch_size, max_feasible_gamma):
        gamma = min(self.gammas.pop(0) if self.gammas else 1, max_feasible_gamma)
        return Decision(gamma, "scripted", rewards={gamma: 1.0})

    def observe(self, feedback):
        self.seen.append(feedback)

    def summary(self):
        return {"policy": self.name, "acceptance": {"rates": [0.5]}}


class SlowDecider(Policy):
    """Decides K from a script once every 8 steps of its one bucket and holds in between, like the
    online policy's control_interval."""

    name = "slow"
    rules = KRules(control_interval=8)

    def __init__(self, gammas):
        self.gammas = list(gammas)
        self.bucket = None
        self.seen: list[StepFeedback] = []

    def _bucket(self, batch_size):
        if self.bucket is None:
            self.bucket = super()._bucket(batch_size)
        return self.bucket

    def _target(self, bucket, batch_size, current, low, high):
        return Target(self.gammas.pop(0), "scripted")

    def observe(self, feedback):
        self.seen.append(feedback)


def make(tmp_path, gammas, method="ngram", policy=None, prefix_caching=True, **adaptive):
    spec = validate_spec({
        "method": method, "target_model": "t", "drafter": "d" if method != "ngram" else None, "gamma": 4,
        "adaptive": {"enabled": True, "trace": str(tmp_path / "trace.jsonl"),
                     "samples": str(tmp_path / "samples.jsonl"), **adaptive},
    })
    policy = policy or ScriptedPolicy(gammas)
    clock = iter(range(1000, 100000))
    return AdaptiveController(spec, max_gamma=4, max_batched_tokens=64, policy=policy,
                              clock=lambda: float(next(clock)), prefix_caching=prefix_caching), policy


def step(batch=2, drafted=(2, 2), accepted=(1, 2), start=0.0, end=0.010, pure=True, **gammas):
    return ObservedStep(drafted=drafted, accepted=accepted, batch_size=batch, pure_decode=pure,
                        scheduled_at=start, completed_at=end, **gammas)


def test_feedback_is_attributed_to_the_k_that_drafted_the_verified_tokens(tmp_path):
    controller, policy = make(tmp_path, [2, 2, 3, 3])
    controller.choose_gamma(2)                       # K=2 drafted at the end of step 1
    controller.observe_step(step(start=0.0, end=0.010))
    controller.choose_gamma(2)
    controller.observe_step(step(start=0.010, end=0.020))
    controller.choose_gamma(2)                       # switch to 3: step 3 verifies K=2 drafts
    controller.observe_step(step(start=0.020, end=0.030))
    assert [f.gamma for f in policy.seen[1:]] == [2, 2]
    assert policy.seen[1].stable is True
    assert policy.seen[2].stable is False            # verified K=2 drafts but drafted K=3: mixed costs


def test_overlapping_steps_are_attributed_to_the_k_the_scheduler_remembered(tmp_path):
    """Async scheduling: the next step's K is chosen before this step is observed."""
    controller, policy = make(tmp_path, [2, 3, 3, 3])
    controller.choose_gamma(2)                       # step 1 drafts with K=2
    controller.choose_gamma(2)                       # step 2 (verifies K=2) drafts with K=3
    controller.observe_step(step(start=0.0, end=0.010, verified_gamma=4, drafting_gamma=2))
    controller.choose_gamma(2)                       # step 3 (verifies K=3) drafts with K=3
    controller.observe_step(step(start=0.005, end=0.020, verified_gamma=2, drafting_gamma=3))
    controller.choose_gamma(2)
    controller.observe_step(step(start=0.015, end=0.030, verified_gamma=3, drafting_gamma=3))
    assert [f.gamma for f in policy.seen[1:]] == [2, 3]
    assert [f.stable for f in policy.seen[1:]] == [False, True]
    assert round(policy.seen[2].interval_ms, 3) == 10.0  # from the previous completion, not its schedule()


def test_interval_does_not_count_idle_time_or_overlap(tmp_path):
    controller, policy = make(tmp_path, [1, 1, 1])
    controller.choose_gamma(2)
    controller.observe_step(step(start=0.0, end=0.010))
    controller.choose_gamma(2)
    controller.observe_step(step(start=5.0, end=5.020))   # idle gap before this step's schedule()
    controller.choose_gamma(2)
    controller.observe_step(step(start=5.015, end=5.030))  # scheduled before the previous completed
    assert round(policy.seen[1].interval_ms, 3) == 20.0
    assert round(policy.seen[2].interval_ms, 3) == 10.0


def test_admission_steps_are_not_stable(tmp_path):
    controller, policy = make(tmp_path, [1, 1])
    controller.choose_gamma(2)
    controller.observe_step(step())
    controller.choose_gamma(2)
    controller.observe_step(step(pure=False))
    assert policy.seen[1].stable is False


def test_feasibility_caps_k_by_batched_tokens(tmp_path):
    controller, _ = make(tmp_path, [4])
    assert controller.max_feasible_gamma(16) == 3      # 16 * (3+1) = 64 tokens
    assert controller.choose_gamma(16) == 3


def test_sticky_zero_holds_until_the_cohort_drains_for_model_drafters(tmp_path):
    controller, _ = make(tmp_path, [0, 3, 3, 3], method="draft")
    assert controller.choose_gamma(4) == 0
    assert controller.choose_gamma(4) == 0             # the policy is not asked while the cohort runs
    controller.choose_gamma(0)                         # drained
    assert controller.choose_gamma(2) == 3


def test_sticky_zero_ends_when_the_engine_goes_idle(tmp_path):
    """A real engine never schedules an empty batch: the cohort drains when the last request finishes
    (the scheduler reports the step after which nothing is left), and the next batch may draft."""
    controller, _ = make(tmp_path, [0, 3, 3], method="draft")
    assert controller.choose_gamma(4) == 0
    controller.observe_step(step(batch=4, drafted=(0,) * 4, accepted=(0,) * 4), idle_after=True)
    assert controller.choose_gamma(4) == 3


def test_sticky_zero_reprobes_without_draining_and_backs_off(tmp_path):
    """Under continuous load the batch never drains: the policy is asked again after
    gamma0_reprobe_steps held steps, then after twice as many while it keeps K=0."""
    controller, policy = make(tmp_path, [0, 0, 3], method="draft", gamma0_reprobe_steps=2)
    ks = [controller.choose_gamma(4) for _ in range(9)]
    #          ask hold x2  ask: 0 again  hold x4      ask: 3
    assert ks == [0, 0, 0, 0, 0, 0, 0, 0, 3]
    assert not policy.gammas, "the policy was asked exactly three times"


def test_a_reprobe_is_a_decision_even_when_the_policy_would_hold(tmp_path):
    """A policy that decides every 8 steps left its countdown where its K=0 decision put it; the
    cohort does not ask it while holding, so without a nudge the probe would be one of its "hold"
    steps and keep K=0 unseen."""
    policy = SlowDecider([0, 3])
    controller, _ = make(tmp_path, [], method="draft", policy=policy, gamma0_reprobe_steps=2)
    assert [controller.choose_gamma(4) for _ in range(4)] == [0, 0, 0, 3]
    assert not policy.gammas, "the probe asked the policy for its next decision"


def test_the_cohort_after_a_drained_zero_cohort_starts_with_a_decision(tmp_path):
    """Seen in the bench (chat, batch 1, EAGLE-3): an exploring K=0 latched the cohort, and each of
    the next three requests began on the "hold" steps its decision had left, so K=0 latched again
    for three whole requests although K=1 paid. The first step after the drain must ask the policy."""
    policy = SlowDecider([0, 3])
    controller, _ = make(tmp_path, [], method="draft", policy=policy)
    assert controller.choose_gamma(1) == 0   # the policy's decision: K=0, held for 8 of its steps
    assert controller.choose_gamma(1) == 0   # sticky: not asked
    controller.observe_step(step(batch=1, drafted=(0,), accepted=(0,)), idle_after=True)
    assert controller.choose_gamma(1) == 3   # a new request: the policy decides again
    assert not policy.gammas


def test_a_probe_that_returns_to_zero_soon_doubles_the_next_hold():
    """Under load a probe runs K>0 for the few steps the acceptance model needs and goes back to 0
    while speculation keeps losing: that is a failed probe, and the holds lengthen as when the probe
    kept K=0. K>0 kept for reprobe_steps steps succeeded: the hold starts afresh."""
    cohort = StickyZero(reprobe_steps=4)

    def held_until_probe():
        steps = 0
        while cohort.holds():
            steps += 1
        return steps

    cohort.chose(0)
    holds = []
    for _ in range(6):
        holds.append(held_until_probe())
        cohort.chose(2)  # the probe drafts ...
        cohort.chose(2)
        cohort.chose(0)  # ... and comes back to K=0 within 4 steps
    assert holds == [4, 8, 16, 32, 64, 4 * MAX_BACKOFF]
    held_until_probe()
    for _ in range(5):
        cohort.chose(3)  # speculation pays again: K>0 for reprobe_steps steps
    cohort.chose(0)
    assert held_until_probe() == 4


def test_requests_the_cohort_skipped_are_not_counted_as_failed_drafts(tmp_path):
    """The K=0 fast path skips a model drafter in a cohort's pure decode steps, and those requests
    draft nothing for the rest of their lives. Their empty drafts at a re-probe are no failures of
    the budget: the policy is told they cannot draft (requests admitted since, or that drafted after
    all, can)."""
    controller, policy = make(tmp_path, [0, 2, 2, 2], method="draft", gamma0_reprobe_steps=1)
    clock = iter(range(100))

    def run_step(batch_ids, drafted=(), accepted=(), request_ids=(), pure=True, finished=()):
        gamma = controller.choose_gamma(len(batch_ids))
        start = next(clock) / 100
        controller.observe_step(ObservedStep(
            drafted=drafted, accepted=accepted, batch_size=len(batch_ids), pure_decode=pure,
            scheduled_at=start, completed_at=start + 0.01, request_ids=request_ids, batch_ids=batch_ids,
            finished=finished))
        return gamma, policy.seen[-1]

    assert run_step(("a", "b", "c"))[0] == 0                 # K=0 decided: the drafter skips a, b, c
    assert run_step(("a", "b", "c", "d"), pure=False)[0] == 0  # held; d admitted (a prefill step runs it)
    assert run_step(("a", "b", "c", "d"))[0] == 2            # the probe; drafts for the next step
    gamma, step = run_step(("a", "b", "c", "d"), (2,), (2,), ("d",))  # only d drafted
    assert step.stable and step.cannot_draft == ("a", "b", "c")
    assert step.acceptance_trials() == ((2,), (2,))          # not ((2, 2, 2, 2), (2, 0, 0, 0))
    gamma, step = run_step(("b", "c", "d"), (2, 2), (1, 2), ("b", "d"), finished=("a",))  # b recomputed
    assert step.cannot_draft == ("c",)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_without_prefix_caching_requests_admitted_at_k0_cannot_draft(tmp_path, prefix_caching):
    """With prefix caching off the K=0 fast path skips the drafter in prompt steps too, so a request
    admitted inside the cohort has no drafter cache at all: at the probe its empty draft is "cannot
    draft", not a rejected budget. With prefix caching on its prompt pass ran (the prompt blocks may
    serve later requests), and only the pure decode steps after it were skipped."""
    controller, policy = make(tmp_path, [0, 2, 2, 2], method="draft", gamma0_reprobe_steps=1,
                              prefix_caching=prefix_caching)
    clock = iter(range(100))

    def run_step(batch_ids, pure=True, drafted=(), accepted=(), request_ids=()):
        gamma = controller.choose_gamma(len(batch_ids))
        start = next(clock) / 100
        controller.observe_step(ObservedStep(
            drafted=drafted, accepted=accepted, batch_size=len(batch_ids), pure_decode=pure,
            scheduled_at=start, completed_at=start + 0.01, request_ids=request_ids, batch_ids=batch_ids))
        return gamma, policy.seen[-1]

    assert run_step(("a", "b"))[0] == 0                  # K=0 decided: the drafter skips a, b
    assert run_step(("a", "b", "c"), pure=False)[0] == 0  # held; c admitted in a prompt step
    assert run_step(("a", "b", "c"))[0] == 2              # the probe: drafts for the next step
    if prefix_caching:
        _, step = run_step(("a", "b", "c"), drafted=(2,), accepted=(1,), request_ids=("c",))
        assert step.cannot_draft == ("a", "b")           # c's prompt pass ran, its decode steps did not
        assert step.acceptance_trials() == ((2,), (1,))
    else:
        _, step = run_step(("a", "b", "c"))
        assert step.cannot_draft == ("a", "b", "c")      # c never had a drafter pass
        assert step.acceptance_trials() == ((), ())      # no failed budgets: nobody could draft


def test_ngram_requests_are_never_reported_unable_to_draft(tmp_path):
    controller, policy = make(tmp_path, [0, 0, 2, 2])
    for index in range(4):
        controller.choose_gamma(2)
        controller.observe_step(ObservedStep(drafted=(), accepted=(), batch_size=2, pure_decode=True,
                                             scheduled_at=index, completed_at=index + 0.01, batch_ids=("a", "b")))
    assert all(not feedback.cannot_draft for feedback in policy.seen)


def test_sticky_zero_without_reprobe_holds_until_idle(tmp_path):
    controller, _ = make(tmp_path, [0, 3], method="draft", gamma0_reprobe_steps=0)
    assert [controller.choose_gamma(4) for _ in range(50)] == [0] * 50


def test_ngram_zero_is_not_sticky(tmp_path):
    controller, _ = make(tmp_path, [0, 3])
    assert controller.choose_gamma(4) == 0
    assert controller.choose_gamma(4) == 3


def test_trace_samples_and_snapshot(tmp_path):
    controller, _ = make(tmp_path, [2, 3, 3])
    for index in range(3):
        controller.choose_gamma(2)
        controller.observe_step(step(start=0.01 * index, end=0.01 * (index + 1)))
    summary = controller.close()
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [line["gamma"] for line in trace] == [2, 3, 3]
    assert trace[0]["acceptance"] == {"rates": [0.5]}
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and samples[0]["committed"] == 2 + 3
    assert [sample["time"] for sample in samples] == [0.01, 0.02, 0.03]  # when each step completed: cut by round
    assert summary["selections"] == {"2": 1, "3": 2} and summary["switches"] == 2
    assert summary["mean_gamma"] == round(8 / 3, 3)


def test_online_trace_shows_the_arms_and_cost_line_each_decision_read(tmp_path):
    """Why a decision went wrong is read from the trace: the bucket's arms (with the tokens they
    verified per request) and its cost line, as the decision saw them."""
    from vspec_runtime.control.online import OnlinePolicy

    controller, _ = make(tmp_path, [], policy=OnlinePolicy(max_gamma=4, control_interval=1, start_gamma=2))
    for index in range(12):
        gamma = controller.choose_gamma(2)
        drafts = (gamma, 0) if index % 2 else (gamma, gamma)  # the second request finds a match on every other step
        controller.observe_step(step(drafted=drafts, accepted=(1, 0), start=0.01 * index,
                                     end=0.01 * index + 0.008 + 0.001 * sum(drafts),
                                     batched_tokens=2 + sum(drafts)))
    controller.close()
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    state = trace[-1]["bucket_state"]
    arms = {int(gamma): arm for gamma, arm in state["arms"].items() if arm["samples"]}
    assert any(gamma > 0 for gamma in arms), state
    for gamma, arm in arms.items():
        # Every other step one request of two drafted nothing: between 1 and 1 + K tokens a request
        # (K = 0 verifies exactly one).
        tokens = arm["verified_per_request_step"]
        assert (tokens == 1.0) if gamma == 0 else (1.0 < tokens < 1.0 + gamma), (gamma, arm)
        assert arm["ms_per_request_step"] > 0
    assert state["cost_line"] is not None, "fills that vary give the line a slope"


def test_interleaved_bench_switches_policies_only_when_idle_and_each_keeps_its_state(tmp_path, monkeypatch):
    """VSPEC_BENCH_POLICIES: one engine, several labelled policies; the driver names the next one in a
    file, and the controller switches when the engine is idle, never in the middle of a round."""
    labelled = {
        "fixed:1": {"gamma": 4, "adaptive": {"enabled": True, "policy": "fixed", "fixed_gamma": 1}},
        "fixed:3": {"gamma": 4, "adaptive": {"enabled": True, "policy": "fixed", "fixed_gamma": 3}},
        "online": {"gamma": 2, "adaptive": {"enabled": True, "policy": "online", "control_interval": 1}},
    }
    monkeypatch.setenv("VSPEC_BENCH_POLICIES", json.dumps(labelled))
    monkeypatch.setenv("VSPEC_RUN_DIR", str(tmp_path))
    spec = validate_spec({"method": "ngram", "target_model": "t", "gamma": 4,
                          "adaptive": {"enabled": True, "trace": str(tmp_path / "trace.jsonl")}})
    controller = AdaptiveController(spec, max_gamma=4, max_batched_tokens=64)
    label_file = tmp_path / "bench-policy"

    def round_of(label, steps=3):
        label_file.write_text(label)
        chosen = []
        for index in range(steps):
            chosen.append(controller.choose_gamma(2))
            if index == 0:
                label_file.write_text("fixed:1")  # a write mid-round must not switch
            controller.observe_step(step(start=0.01 * index, end=0.01 * index + 0.01), idle_after=index == steps - 1)
        return chosen

    assert round_of("fixed:3") == [3, 3, 3]
    assert round_of("fixed:1") == [1, 1, 1]
    online_k = round_of("online", steps=6)
    assert max(online_k) <= 2, "a label keeps its own max K"
    assert round_of("fixed:3") == [3, 3, 3]
    assert controller.snapshot()["active_policy"] == "fixed:3"
    decisions = controller.policy.policies["online"].inner  # guarded; the inner policy kept its steps
    assert decisions.summary()["policy"] == "online"
    traced = {line.get("policy") for line in map(json.loads, (tmp_path / "trace.jsonl").read_text().splitlines())}
    assert {"fixed:1", "fixed:3", "online"} <= traced
    assert set(controller.summary()["policy_summary"]) == set(labelled)
