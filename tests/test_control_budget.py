"""The per-decision micro-benchmark runs; its numbers are reported, never asserted (no timing tests)."""

from __future__ import annotations

from vspec_runtime.control import OnlinePolicy
from vspec_runtime.control.budget import time_per_decision_us


def test_micro_benchmark_returns_a_duration():
    microseconds = time_per_decision_us(lambda: OnlinePolicy(max_gamma=6), steps=200)
    assert microseconds > 0.0
