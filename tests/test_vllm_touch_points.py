"""Every vLLM member the adaptive scheduler reads is in one checked list (vspec_runtime/vllm_surface.py).

An upstream rename must fail `vspec doctor` and the scheduler's start-up check, naming the member,
instead of leaving K frozen without a word; the adapter (vspec_runtime/vllm_adapter.py) that reads
vLLM's step objects must build the same ObservedStep the scheduler built inline before.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
from pathlib import Path

import pytest

from cli_helpers import run_cli
from test_doctor import build_standin_vllm, run_doctor_in
from vspec_cli import doctor_checks
from vspec_runtime import patches, vllm_adapter, vllm_surface
from vspec_runtime.controller import ObservedStep
from vspec_runtime.vllm_surface import SURFACE

REPO = Path(__file__).resolve().parents[1]
TARGETS = {sym.target for sym in SURFACE}
ADAPTIVE_MEMBERS = [sym for sym in SURFACE if "adaptive" in sym.needed_for and sym.kind != "class"]


# --- a stand-in vLLM, loaded beside the real one --------------------------------------------------


def standin_importer(root: Path):
    """``import_module`` for doctor's checks that loads the stand-in's files without touching
    sys.modules, so the real vLLM this process already imported stays as it is."""
    loaded: dict[str, object] = {}

    def import_module(name: str):
        if name not in loaded:
            base = root.joinpath(*name.split("."))
            path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if not path.is_file():
                raise ImportError(f"No module named '{name}'")
            spec = importlib.util.spec_from_file_location(f"_vspec_standin.{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded[name]

    return import_module


def _failed_symbols(report: doctor_checks.Report) -> list[str]:
    return [c.name for c in report.checks if c.status == "fail" and c.kind == "vllm-symbol"]


@pytest.mark.parametrize("sym", ADAPTIVE_MEMBERS, ids=[s.name for s in ADAPTIVE_MEMBERS])
def test_renaming_any_adaptive_member_fails_doctor_naming_it(tmp_path, sym):
    root = build_standin_vllm(tmp_path / "standin", hidden=sym.name)
    report = doctor_checks.run_doctor(adaptive=True, import_module=standin_importer(root), plugin_probe=False)
    assert report.failed
    assert _failed_symbols(report) == [sym.name]


def test_the_doctor_command_fails_on_a_renamed_scheduler_member(tmp_path):
    """End to end through the CLI: the preset's checks include the scheduler's reads."""
    hidden = "vllm.v1.core.sched.scheduler.Scheduler.running"
    root = build_standin_vllm(tmp_path / "standin", hidden=hidden)
    result = run_doctor_in(root, "--preset", "demo", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    failed = {c["name"]: c["reason"] for c in report["checks"] if c["status"] == "fail"}
    assert list(failed) == [hidden]
    assert "no longer sets self.running" in failed[hidden]


def test_an_extension_fails_when_one_of_its_symbols_is_gone(tmp_path):
    hidden = "vllm.utils.cpu_triton_utils._expand_kernel_impl"
    root = build_standin_vllm(tmp_path / "standin", hidden=hidden)
    method, adaptive, extensions = doctor_checks.preset_scope("demo")
    report = doctor_checks.run_doctor(method, adaptive, import_module=standin_importer(root), plugin_probe=False,
                               extensions=extensions)
    checks = {c.name: c for c in report.checks if c.kind == "extension"}
    assert checks["extension cpu-expand-kernel"].status == "fail"
    assert hidden in checks["extension cpu-expand-kernel"].reason
    assert checks["extension qwen2-eagle-models"].status == "ok"


def test_doctor_preset_demo_lists_the_extension_checks(capsys):
    result = run_cli(capsys, "doctor", "--preset", "demo", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    from vspec_cli.resolve import resolve_spec

    expected = {f"extension {e.name}" for e in patches.enabled_for(resolve_spec("demo", None, {}), include_shims=True)}
    extensions = {c["name"]: c for c in report["checks"] if c["kind"] == "extension"}
    assert set(extensions) == expected
    assert {"extension cpu-expand-kernel", "extension qwen2-eagle-models"} <= expected
    assert all(c["status"] == "ok" for c in extensions.values())
    names = {c["name"] for c in report["checks"]}
    # demo is n-gram with adaptive K: the scheduler's reads are checked, the EAGLE head's are not.
    assert "vllm.v1.outputs.ModelRunnerOutput.sampled_token_ids" in names
    assert "vllm.model_executor.models.qwen2.Qwen2DecoderLayer" not in names


def test_preset_and_method_do_not_mix(capsys):
    result = run_cli(capsys, "doctor", "--preset", "demo", "--method", "eagle")
    assert result.exit_code != 0 and "--preset" in result.stderr


# --- every member read is listed --------------------------------------------------------------------

# Names the scheduler and the adapter give vLLM's objects -> the SURFACE class they are.
_OBJECTS = {
    "self": "vllm.v1.core.sched.scheduler:Scheduler",
    "scheduler": "vllm.v1.core.sched.scheduler:Scheduler",
    "kv_cache_manager": "vllm.v1.core.kv_cache_manager:KVCacheManager",
    "block_pool": "vllm.v1.core.block_pool:BlockPool",
    "output": "vllm.v1.core.sched.output:SchedulerOutput",
    "scheduler_output": "vllm.v1.core.sched.output:SchedulerOutput",
    "model_runner_output": "vllm.v1.outputs:ModelRunnerOutput",
    "draft_token_ids": "vllm.v1.outputs:DraftTokenIds",
    "request": "vllm.v1.request:Request",
    "sampling_params": "vllm.sampling_params:SamplingParams",
    "requests": "vllm.v1.request:Request",  # requests[rid].x: one request of the table
    "vllm_config": "vllm.config.vllm:VllmConfig",
    "scheduler_config": "vllm.config.scheduler:SchedulerConfig",
}


def _members_read(path: Path) -> set[str]:
    """``owner:Class.member`` for every vLLM member the module reads (vspec's own are ``_private``)."""
    read = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute) or node.attr.startswith("_"):
            continue
        owner = node.value.value if isinstance(node.value, ast.Subscript) else node.value
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            read.add(f"{_OBJECTS['self']}.{node.attr}")
        elif isinstance(owner, ast.Name) and owner.id in _OBJECTS:
            if owner.id == "requests" and not isinstance(node.value, ast.Subscript):
                continue  # requests.get(...) is the dict's own method
            read.add(f"{_OBJECTS[owner.id]}.{node.attr}")
    return read


def test_every_member_the_scheduler_reads_is_listed_for_adaptive():
    read = _members_read(REPO / "vspec_runtime" / "scheduler.py")
    assert "vllm.v1.core.sched.scheduler:Scheduler.running" in read
    assert "vllm.config.scheduler:SchedulerConfig.async_scheduling" in read  # picks the base class
    by_target = {sym.target: sym for sym in SURFACE}
    unlisted = sorted(read - TARGETS)
    assert not unlisted, f"add these to vllm_surface.SURFACE: {unlisted}"
    assert all("adaptive" in by_target[target].needed_for for target in read)


def test_the_adapter_reads_exactly_its_symbols_and_they_are_listed():
    read = _members_read(REPO / "vspec_runtime" / "vllm_adapter.py")
    assert read == set(vllm_adapter.SYMBOLS)
    by_target = {sym.target: sym for sym in SURFACE}
    assert all("adaptive" in by_target[target].needed_for for target in vllm_adapter.SYMBOLS)


def test_every_extension_lists_its_symbols_in_the_surface():
    for extension in patches.REGISTRY:
        symbols = patches.symbols_of(extension)
        assert symbols and set(symbols) <= TARGETS, extension.name


def test_the_version_lookup_is_a_registered_shim_that_apply_all_leaves_alone():
    from vspec_runtime import vllm_entry
    from vspec_runtime.spec import RuntimeSpec

    shim = next(e for e in patches.REGISTRY if e.name == "vllm-version-lookup")
    assert shim.kind == "shim" and shim.module == "vspec_runtime.vllm_entry"
    assert getattr(vllm_entry, shim.install) is vllm_entry.install_version_shim
    spec = RuntimeSpec(method="ngram", target_model="t")
    assert shim not in patches.enabled_for(spec)
    assert (shim in patches.enabled_for(spec, include_shims=True)) is (not vllm_entry.vllm_metadata_present())


# --- the adapter builds the same ObservedStep as before --------------------------------------------


def _observed_step_as_before(scheduler_output, model_runner_output, scheduled_at, completed, requests, wants_context):
    """AdaptiveScheduler._observe's body before the adapter existed, verbatim but for ``self``."""
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    sampled = model_runner_output.sampled_token_ids
    index_of = model_runner_output.req_id_to_index
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    drafted, accepted = [], []
    for req_id, drafts in spec_tokens.items():
        index = index_of.get(req_id)
        if index is None or not sampled or index >= len(sampled):
            continue
        drafted.append(len(drafts) - invalid.get(req_id, 0))
        accepted.append(max(len(sampled[index]) - 1, 0))
    num_scheduled = scheduler_output.num_scheduled_tokens
    pure_decode = (
        not scheduler_output.scheduled_new_reqs
        and not scheduler_output.preempted_req_ids
        and all(count == 1 + len(spec_tokens.get(req_id, ())) for req_id, count in num_scheduled.items())
    )
    context_tokens = 0
    if wants_context:
        context_tokens = sum(requests[rid].num_computed_tokens for rid in num_scheduled if rid in requests)
    return ObservedStep(
        drafted=tuple(drafted), accepted=tuple(accepted), batch_size=len(num_scheduled), pure_decode=pure_decode,
        scheduled_at=scheduled_at, completed_at=completed,
        batched_tokens=scheduler_output.total_num_scheduled_tokens, context_tokens=context_tokens,
    )


def _request(req_id: str, computed: int):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    request = Request(req_id, list(range(1, 9)), SamplingParams(max_tokens=16), None)
    request.num_computed_tokens = computed
    return request


def _scheduler_output(num_scheduled, spec_tokens, new=(), preempted=None, invalid=None):
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    return SchedulerOutput(
        scheduled_new_reqs=[NewRequestData.from_request(r, ([0],)) for r in new],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens=dict(num_scheduled),
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        scheduled_spec_decode_tokens={k: list(v) for k, v in spec_tokens.items()},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        preempted_req_ids=preempted,
        num_invalid_spec_tokens=invalid,
        num_spec_tokens_to_schedule=3,
    )


def _runner_output(sampled: dict[str, list[int]]):
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sampled)
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=[sampled[r] for r in req_ids])


def _cases():
    a, b, c = _request("a", 40), _request("b", 25), _request("c", 0)
    requests = {"a": a, "b": b, "c": c}
    decode = _scheduler_output({"a": 4, "b": 3}, {"a": [7, 8, 9], "b": [5, 6]})
    yield "pure decode", decode, _runner_output({"a": [1, 2, 3], "b": [4]}), requests
    yield "invalid drafts", _scheduler_output({"a": 4, "b": 3}, {"a": [7, 8, 9], "b": [5, 6]}, invalid={"a": 2}), \
        _runner_output({"a": [1], "b": [4, 5, 6]}), requests
    yield "request gone from the output", decode, _runner_output({"b": [4, 5]}), requests
    yield "nothing sampled", decode, _runner_output({}), requests
    yield "admits a request", _scheduler_output({"a": 4, "c": 8}, {"a": [7, 8, 9]}, new=[c]), \
        _runner_output({"a": [1, 2], "c": [3]}), requests
    yield "preempts", _scheduler_output({"a": 4}, {"a": [7, 8, 9]}, preempted={"b"}), _runner_output({"a": [1]}), requests
    yield "chunked prefill", _scheduler_output({"a": 4, "b": 16}, {"a": [7, 8, 9]}), \
        _runner_output({"a": [1, 2, 3, 4], "b": [9]}), requests
    yield "request table lacks one", decode, _runner_output({"a": [1, 2], "b": [4]}), {"a": a}


@pytest.mark.parametrize("wants_context", [False, True])
def test_the_adapter_builds_the_same_observed_step_as_before(wants_context):
    for label, scheduler_output, runner_output, requests in _cases():
        before = _observed_step_as_before(scheduler_output, runner_output, 1.0, 1.5, requests, wants_context)
        after = vllm_adapter.observed_step(scheduler_output, runner_output, scheduled_at=1.0, completed_at=1.5,
                                           requests=requests if wants_context else None)
        # Added since: which request each (drafted, accepted) pair belongs to, every request of the
        # step, and who finished.
        assert dataclasses.replace(after, request_ids=(), batch_ids=(), finished=()) == before, label
        assert len(after.request_ids) == len(after.drafted), label
        assert set(after.request_ids) <= set(scheduler_output.scheduled_spec_decode_tokens), label
        assert after.batch_ids == tuple(scheduler_output.num_scheduled_tokens), label
        assert len(after.batch_ids) == after.batch_size and set(after.request_ids) <= set(after.batch_ids), label
    step = vllm_adapter.observed_step(*next(_cases())[1:3], scheduled_at=1.0, completed_at=1.5,
                                      requests=next(_cases())[3])
    assert step == ObservedStep(drafted=(3, 2), accepted=(2, 0), batch_size=2, pure_decode=True, scheduled_at=1.0,
                                completed_at=1.5, batched_tokens=7, context_tokens=65, request_ids=("a", "b"),
                                batch_ids=("a", "b"))


def test_confidence_cuts_count_only_decoding_requests_cut_below_k():
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.request import RequestStatus

    done, chunk = _request("done", 10), _request("chunk", 4)
    done.status = RequestStatus.FINISHED_STOPPED
    chunk.is_prefill_chunk = True
    requests = {"cut": _request("cut", 10), "full": _request("full", 10), "empty": _request("empty", 10),
                "done": done, "chunk": chunk}
    drafts = DraftTokenIds(req_ids=["cut", "full", "empty", "done", "chunk", "unknown"],
                           draft_token_ids=[[1, 2], [1, 2, 3, 4], [], [1], [1], [1]])
    assert vllm_adapter.confidence_cuts(drafts, requests, asked=4) == {"cut": 2}


# --- the scheduler's start-up check ---------------------------------------------------------------


@pytest.fixture
def adaptive_scheduler_env(monkeypatch):
    """An adaptive spec in the environment and vLLM's Scheduler.__init__ stubbed (no engine needed)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vspec_cli.resolve import resolve_spec
    from vspec_runtime import activation, scheduler

    # wraps: the surface check still reads the real __init__'s signature and source through __wrapped__.
    @functools.wraps(Scheduler.__init__)
    def bare_init(self, *args, **kwargs):
        self.dynamic_sd_lookup, self.num_spec_tokens = None, 0  # per-step K off: the controller stays idle

    monkeypatch.setenv("VSPEC_SPEC", resolve_spec("demo", None, {}).to_json())
    monkeypatch.setattr(Scheduler, "__init__", bare_init)
    monkeypatch.setattr(scheduler, "_surface_ok", False)
    activation.active_spec.cache_clear()
    yield scheduler
    activation.active_spec.cache_clear()


def test_startup_check_raises_naming_a_missing_member(adaptive_scheduler_env, monkeypatch):
    from vllm.v1.request import Request

    from vspec_runtime.patches import IncompatibleVllm

    monkeypatch.delattr(Request, "is_finished")
    with pytest.raises(IncompatibleVllm, match=r"vllm\.v1\.request\.Request\.is_finished.*`vspec doctor"):
        adaptive_scheduler_env.AdaptiveScheduler()


def test_startup_check_passes_once_per_process(adaptive_scheduler_env, monkeypatch):
    calls = []
    real = vllm_surface.problem
    monkeypatch.setattr(vllm_surface, "problem", lambda sym, *a: calls.append(sym) or real(sym, *a))
    adaptive_scheduler_env.AdaptiveScheduler()
    checked = len(calls)
    assert checked == len([s for s in SURFACE if "adaptive" in s.needed_for])
    adaptive_scheduler_env.AdaptiveScheduler()
    assert len(calls) == checked, "the surface is checked once per process"
