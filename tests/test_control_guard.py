"""GuardedPolicy: a failing policy freezes at a safe K, logs once, never raises."""

from __future__ import annotations

import logging

import pytest

from vspec_runtime.control.base import Decision, Policy, StepFeedback
from vspec_runtime.control.guard import GuardedPolicy
from vspec_runtime.control.static import FixedPolicy

FEEDBACK = StepFeedback(batch_size=2, gamma=3, drafted=(3, 3), accepted=(1, 2), interval_ms=20.0, stable=True)


class Exploding(Policy):
    """Works for ``healthy_steps`` choose calls, then raises in ``where``."""

    name = "exploding"

    def __init__(self, where: str, healthy_steps: int = 2) -> None:
        self.where, self.healthy_steps, self.calls = where, healthy_steps, 0

    def choose(self, batch_size, max_feasible_gamma):
        self.calls += 1
        if self.where == "choose" and self.calls > self.healthy_steps:
            raise RuntimeError("boom in choose")
        return Decision(5, "exploit")

    def observe(self, feedback):
        if self.where == "observe" and self.calls > self.healthy_steps:
            raise ZeroDivisionError("boom in observe")


class ReturnsGarbage(Exploding):
    def choose(self, batch_size, max_feasible_gamma):
        return 3


class Overreaching(Exploding):
    def choose(self, batch_size, max_feasible_gamma):
        return Decision(99 if batch_size > 1 else -4, "exploit", rewards={1: 0.5})


class BrokenSummary(Exploding):
    def summary(self):
        raise KeyError("summary")


@pytest.mark.parametrize("where", ["choose", "observe"])
def test_fault_freezes_at_safe_gamma_and_logs_once(where, caplog):
    guard = GuardedPolicy(Exploding(where), safe_gamma=2, max_gamma=6)
    caplog.set_level(logging.ERROR, logger="vspec.control")
    decisions = []
    for _ in range(10):
        decisions.append(guard.choose(4, 6))
        guard.observe(FEEDBACK)
    assert [d.gamma for d in decisions[:2]] == [5, 5]
    assert all((d.gamma, d.reason) == (2, "fault") for d in decisions[3:])
    records = [record for record in caplog.records if record.name == "vspec.control"]
    assert len(records) == 1
    assert records[0].exc_info is not None and "boom" in str(records[0].exc_info[1])
    assert guard.summary()["guard"]["faulted"] is True


def test_frozen_k_still_respects_feasibility():
    guard = GuardedPolicy(Exploding("choose", healthy_steps=0), safe_gamma=4, max_gamma=6)
    assert guard.choose(8, 1) == Decision(1, "fault")


def test_non_decision_return_is_a_fault(caplog):
    guard = GuardedPolicy(ReturnsGarbage("never"), safe_gamma=1, max_gamma=6)
    assert guard.choose(1, 6) == Decision(1, "fault")
    assert "not a Decision" in guard.fault


def test_out_of_range_k_is_clamped():
    guard = GuardedPolicy(Overreaching("never"), safe_gamma=1, max_gamma=6)
    high = guard.choose(4, 3)
    assert (high.gamma, high.reason, high.rewards) == (3, "clamp", {1: 0.5})
    assert guard.choose(1, 6).gamma == 0
    assert guard.faulted is False


def test_healthy_policy_passes_through():
    guard = GuardedPolicy(FixedPolicy(3), safe_gamma=0, max_gamma=6)
    assert guard.choose(2, 6) == Decision(3, "fixed")
    guard.observe(FEEDBACK)
    summary = guard.summary()
    assert summary["policy"] == "fixed" and summary["steps"] == 1
    assert guard.name == "fixed"


def test_broken_summary_does_not_raise():
    summary = GuardedPolicy(BrokenSummary("never"), safe_gamma=0, max_gamma=6).summary()
    assert "summary_error" in summary and summary["guard"]["faulted"] is False


def test_rejects_unsafe_safe_gamma():
    with pytest.raises(ValueError, match="guard"):
        GuardedPolicy(FixedPolicy(1), safe_gamma=7, max_gamma=6)
