"""Every vLLM symbol vspec relies on (vspec_runtime/vllm_surface.py) exists on the installed vLLM.

A failure here names the symbol and what changed upstream: fix the runtime code that uses it, then
the entry in SURFACE.
"""

from __future__ import annotations

import pytest

from vspec_runtime import vllm_surface
from vspec_runtime.vllm_surface import SURFACE


@pytest.mark.parametrize("sym", SURFACE, ids=[s.name for s in SURFACE])
def test_symbol_exists_with_the_expected_shape(sym):
    assert vllm_surface.problem(sym) is None


def test_surface_entries_are_unique_and_cover_the_hook_points():
    names = [s.name for s in SURFACE]
    assert len(names) == len(set(names))
    for needed in ("vllm.v1.core.sched.scheduler.Scheduler.dynamic_sd_lookup",
                   "vllm.v1.core.sched.output.SchedulerOutput.num_spec_tokens_to_schedule",
                   "vllm.config.speculative.SpeculativeConfig.num_speculative_tokens_per_batch_size",
                   "vllm.model_executor.models.ModelRegistry.register_model",
                   "vllm.general_plugins"):
        assert needed in names


def test_the_checker_reports_drift_it_would_otherwise_miss():
    """problem() must fail on a renamed parameter, a dropped __init__ assignment and a missing field."""
    import dataclasses
    import types

    @dataclasses.dataclass
    class Output:
        other: int = 0

    class Sched:
        def __init__(self, vllm_config, kv_config):
            self.other = 1

        def update_from_output(self, output, runner_output):
            return None

    module = types.ModuleType("fake")
    module.Sched, module.Output = Sched, Output
    lookup = {"fake": module}.__getitem__
    Sym = vllm_surface.Sym

    renamed = vllm_surface.problem(Sym("fake:Sched.update_from_output", "function", "", ("scheduler_output",)), lookup)
    assert "expected (scheduler_output" in renamed
    assert "kv_config" in vllm_surface.problem(Sym("fake:Sched", "class", "", ("vllm_config", "kv_cache_config")), lookup)
    assert "no longer sets self.dynamic_sd_lookup" in vllm_surface.problem(
        Sym("fake:Sched.dynamic_sd_lookup", "attribute", ""), lookup)
    assert vllm_surface.problem(Sym("fake:Sched.other", "attribute", ""), lookup) is None
    assert "has no field 'num_spec_tokens_to_schedule'" in vllm_surface.problem(
        Sym("fake:Output.num_spec_tokens_to_schedule", "field", ""), lookup)
    assert "has no attribute 'Gone'" in vllm_surface.problem(Sym("fake:Gone.x", "function", ""), lookup)
