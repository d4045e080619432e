"""Serving under continuous load, in the simulator: arrivals that never drain (issue 14).

Requests arrive as a Poisson process and the batch changes every few steps but never empties
(``simulate.continuous_load``), so nothing here may rely on the engine going idle. The online policy
is measured alone; the sticky K=0 of a model drafter is measured through the real
``AdaptiveController``, with the engine's rule that a request whose drafter a K=0 step skipped
drafts nothing for the rest of its life (``Scenario.drafter_skipped_at_zero``). Every run is seeded
with common random numbers, so the numbers quoted are exact for this code and the bounds leave
room for honest tuning, not for luck.
"""

from __future__ import annotations

import pytest

from vspec_runtime.control import make_policy
from vspec_runtime.control.base import Decision, Policy
from vspec_runtime.control.simulate import (
    AcceptanceProcess,
    LatencyModel,
    RequestStream,
    Scenario,
    continuous_load,
    goodput_ratio,
    run,
    run_oracle,
)
from vspec_runtime.controller import AdaptiveController, ObservedStep
from vspec_runtime.spec import AdaptiveSettings, validate_spec

SEEDS = (0, 1, 2)
# A small model drafter whose forward costs 15% of a step: worth K=3 at p = 0.85, a loss at p = 0.05.
COSTLY_DRAFTER = LatencyModel(base_ms=20.0, verify_ms_per_token=0.5, knee_tokens=16, draft_ms_per_forward=3.0)


class ControllerAsPolicy(Policy):
    """The real AdaptiveController driven by the simulator: ``choose_gamma`` before a step and
    ``observe_step`` after it, on a clock that advances by the simulated step times."""

    name = "controller"

    def __init__(self, **adaptive) -> None:
        spec = validate_spec({"method": "draft", "target_model": "t", "drafter": "d", "gamma": 6,
                              "adaptive": {"enabled": True, **adaptive}})
        self.now = 0.0
        self.controller = AdaptiveController(spec, max_gamma=6, max_batched_tokens=8192, clock=lambda: self.now)
        self._previous_batch: tuple[str, ...] = ()

    def choose(self, batch_size, max_feasible_gamma):
        return Decision(self.controller.choose_gamma(batch_size), "controller")

    def observe(self, feedback):
        started, self.now = self.now, self.now + feedback.interval_ms / 1000.0
        running = set(feedback.batch_ids)
        finished = tuple(request for request in self._previous_batch if request not in running)
        self._previous_batch = feedback.batch_ids
        self.controller.observe_step(ObservedStep(
            drafted=feedback.drafted, accepted=feedback.accepted, batch_size=feedback.batch_size,
            pure_decode=feedback.stable, scheduled_at=started, completed_at=self.now,
            request_ids=feedback.request_ids, batch_ids=feedback.batch_ids, finished=finished))


@pytest.fixture(autouse=True)
def no_metrics_file(monkeypatch):
    monkeypatch.delenv("VSPEC_RUN_DIR", raising=False)  # the controller publishes a snapshot there


def online():
    return make_policy(AdaptiveSettings(enabled=True), 6)


def switches_per_100_steps(gammas: list[int]) -> float:
    return 100.0 * sum(before != after for before, after in zip(gammas, gammas[1:])) / len(gammas)


# -- the load itself ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_the_batch_changes_all_the_time_and_never_drains(seed):
    scenario = continuous_load(seed=seed)
    sizes = [scenario.batch_at(step) for step in range(scenario.steps)]
    assert min(sizes) >= 1 and max(sizes) <= 16 and 6 <= sum(sizes) / len(sizes) <= 10
    assert len(scenario.batches) > scenario.steps / 10  # a new size every few steps
    admitting = sum(scenario.stream.admits_at(step) for step in range(scenario.steps))
    assert scenario.steps / 20 < admitting < scenario.steps / 5
    assert sizes == [len(scenario.stream.at(step)) for step in range(scenario.steps)]


# -- the online policy: a bounded switch rate, goodput near the oracle ------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_online_switch_rate_is_bounded_and_goodput_near_the_oracle(seed):
    """The batch crosses a power of two (a bucket) every ~20 steps; K follows only when the new
    bucket's estimates beat the running K by the hysteresis, so it changes about as often as the
    oracle's, not at every crossing. Measured (seeds 0-2): 4.2, 3.9, 4.7 switches per 100 steps
    (6.5, 6.7, 5.9 before the crossing hysteresis; the oracle 2.2-3.5) at 0.985, 0.977, 0.981 of the
    oracle's goodput."""
    scenario = continuous_load(seed=seed)
    ratio, result = goodput_ratio(online(), scenario, seed=seed)
    assert switches_per_100_steps(result.gammas) <= 5.5
    assert ratio >= 0.97


def alternating_8_and_9(steps: int = 4000) -> Scenario:
    """Eight requests run throughout; every other step a ninth joins for one step (so the batch crosses
    from bucket 8 to bucket 16 and back at every step, and the ninth's steps are never pure decode)."""
    eight = tuple(range(8))
    live = tuple(eight + (8 + step,) if step % 2 else eight for step in range(steps))
    stream = RequestStream(live, arrivals_per_step=0.5, mean_steps=1, max_batch=16)
    return Scenario("alternating-8-9", AcceptanceProcess.constant(0.75), continuous_load().latency,
                    batches=stream.batch_changes(), steps=steps, stream=stream)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_batch_on_a_bucket_boundary_does_not_flip_k_every_step(seed):
    """Bucket 16 never gets a cost sample here, so it kept its start K while bucket 8 learnt K=2:
    K went 2, 6, 2, 6 at every step (99.8 switches per 100 steps, 0.895 of the oracle). A bucket that
    measured nothing now runs the K that is running."""
    scenario = alternating_8_and_9()
    ratio, result = goodput_ratio(online(), scenario, seed=seed)
    assert switches_per_100_steps(result.gammas) <= 2.0
    assert ratio >= 0.99


# -- sticky K=0 of a model drafter under load -------------------------------------------------------


def rising(seed: int, steps: int = 5000, change: int = 1500) -> Scenario:
    """Speculation loses (p = 0.05) until ``change``, then pays (p = 0.85); the server never drains."""
    return continuous_load(steps, acceptance=AcceptanceProcess.phased((0, 0.05), (change, 0.85)),
                           latency=COSTLY_DRAFTER, drafter_skipped_at_zero=True, seed=seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_k_comes_back_after_k0_when_acceptance_improves_without_an_idle_engine(seed):
    """The controller holds K=0 for the cohort and re-probes after 256, 512, 1024 held steps. The
    probe after the change finds good drafts from the requests that arrived since (the rest cannot
    draft: their drafter was skipped) and K stays up. Measured: speculating for good from step 1838,
    1977, 1871; before, K>0 never came back in 5,000 steps (probes landed on the policy's "hold",
    the skipped requests read as rejected drafts, and the next bucket's stale rewards ended them)."""
    scenario = rising(seed)
    driver = ControllerAsPolicy()
    ratio, result = goodput_ratio(driver, scenario, seed=seed)
    gammas = result.gammas
    assert gammas[200:1500].count(0) / 1300 >= 0.85  # K=0 while speculation loses (0.98, 0.87, 0.95)
    back = next(step for step in range(1500, len(gammas)) if min(gammas[step:step + 100]) > 0)
    assert back <= 1500 + 700, f"K>0 came back only at step {back}"
    assert min(gammas[back:]) > 0
    assert ratio >= 0.95  # measured 0.968, 0.964, 0.961; 0.65 before


@pytest.mark.parametrize("seed", SEEDS)
def test_probes_cost_a_bounded_shrinking_share_while_speculation_keeps_losing(seed):
    """Each probe that ends at K=0 again doubles the next hold (up to 16 x 256 steps). Measured over
    8,000 steps: K>0 on 0.9%, 3.5%, 1.5% of steps, 0.3%, 1.3%, 0% in the second half, at 0.996,
    0.991, 0.995 of the oracle (which runs K=0 throughout)."""
    scenario = continuous_load(8000, acceptance=AcceptanceProcess.constant(0.05), latency=COSTLY_DRAFTER,
                               drafter_skipped_at_zero=True, seed=seed)
    ratio, result = goodput_ratio(ControllerAsPolicy(), scenario, seed=seed)
    drafting = [gamma > 0 for gamma in result.gammas]
    probes = sum(1 for before, after in zip(drafting, drafting[1:]) if after and not before)
    assert probes >= 3, "the controller must keep looking"
    assert sum(drafting) / len(drafting) <= 0.05
    assert sum(drafting[4000:]) / 4000 <= 0.02
    assert ratio >= 0.98


@pytest.mark.parametrize("seed", SEEDS)
def test_controller_switch_rate_is_bounded_through_a_phase_change(seed):
    """Measured: 3.4, 3.6, 3.9 K changes per 100 steps over the K=0 cohort, its probes and the
    speculating phase after it."""
    result = run(ControllerAsPolicy(), None, rising(seed), seed=seed)
    assert switches_per_100_steps(result.gammas) <= 5.0


def test_the_oracle_has_the_same_load():
    """The comparisons above hold the oracle to the same engine: its K=0 skips the drafter too."""
    scenario = rising(0)
    oracle = run_oracle(scenario)
    assert oracle.gammas[:1500].count(0) > 1400 and oracle.gammas[-1] > 0
