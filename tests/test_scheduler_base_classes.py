"""vspec's scheduler over both of vLLM's base classes, driven the way vLLM tests its own schedulers.

vLLM 0.32 schedules a step synchronously (``Scheduler``: the drafts made at the end of step N come back
through ``update_draft_token_ids`` before step N+1 is scheduled) or asynchronously (``AsyncScheduler``:
step N+1 is scheduled while step N runs; each decoding request gets -1 placeholders, as many as step N's
K, and the model runner keeps its drafts). The CPU platform never schedules asynchronously, so no engine
here can run it: these tests build real scheduler objects from a real VllmConfig, the way vLLM's engine
core does (``--scheduler-cls``, ``get_scheduler_cls()``), and play the engine core and the model runner
by hand with built ModelRunnerOutputs. No model is loaded; a run takes milliseconds.

What a user would notice is asserted: the controller's K reaches each step and the drafter, K changes
take effect (0 included), the controller sees the drafts and acceptances vLLM's own counters see and
attributes them to the K that made them, a controller fault freezes K and serving goes on, every request
finishes, and what async scheduling cannot do is said in a warning.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

import tiny_models
from vspec_cli.launch import SCHEDULER_CLS, speculative_config
from vspec_runtime import activation
from vspec_runtime.spec import RuntimeSpec, validate_spec

GAMMA = 4  # the start-up K: vLLM's num_speculative_tokens, the ceiling of every K
SWEEP = (3, 1, 0, 2)  # K per decision, cycled: K changes every step, to 0 and back
BLOCK = 16
NUM_BLOCKS = 1000
MAX_MODEL_LEN = 512
MAX_TOKENS = 14
PROMPT = list(range(3, 13))  # 10 prompt tokens; nothing here stops on EOS
TOKEN = 7  # what the "model" samples
# Drafts each request gets accepted per step: every one, one, none.
ACCEPTS = {"all": GAMMA, "one": 1, "none": 0}
BASES = ["sync", "async"]


# --- building the scheduler as vLLM's engine core does ---------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.write_llama_config(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(autouse=True)
def fresh_activation():
    activation.active_spec.cache_clear()
    yield
    activation.active_spec.cache_clear()


def runtime_spec(model_dir, **adaptive) -> RuntimeSpec:
    settings = {"enabled": True, "policy": "sweep", "sweep_gammas": list(SWEEP), "control_interval": 1,
                "min_gamma": 0, **adaptive}
    return validate_spec({"method": "ngram", "target_model": str(model_dir), "gamma": GAMMA,
                          "serving": {"max_num_seqs": 8}, "adaptive": settings})


def vllm_config(spec: RuntimeSpec, model_dir, async_scheduling: bool):
    """The speculative config `vspec serve` passes (with its per-step K table), resolved by vLLM."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), dtype="float32", seed=0, skip_tokenizer_init=True,
                                 max_model_len=MAX_MODEL_LEN),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=MAX_MODEL_LEN,
                                         is_encoder_decoder=False, scheduler_cls=SCHEDULER_CLS),
        cache_config=CacheConfig(block_size=BLOCK),
        speculative_config=SpeculativeConfig(**speculative_config(spec, None)),
    )
    # vLLM resolved async scheduling off here: the CPU platform never runs it, and vLLM refuses it for
    # the n-gram drafter. CUDA resolves it on for EAGLE and draft models; the scheduler never looks at
    # the drafting method, so set the resolved flag the way such a config would have it.
    config.scheduler_config.async_scheduling = async_scheduling
    config.cache_config.num_gpu_blocks = NUM_BLOCKS  # what the engine core sets after profiling memory
    return config


def build_scheduler(config):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    layer = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv_cache = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["layer"], layer)])
    scheduler_cls = config.scheduler_config.get_scheduler_cls()  # the class --scheduler-cls names
    return scheduler_cls(vllm_config=config, kv_cache_config=kv_cache,
                         structured_output_manager=StructuredOutputManager(config), block_size=BLOCK,
                         log_stats=True)


def make_scheduler(monkeypatch, model_dir, base: str, **adaptive):
    spec = runtime_spec(model_dir, **adaptive)
    monkeypatch.setenv("VSPEC_SPEC", spec.to_json())
    return build_scheduler(vllm_config(spec, model_dir, async_scheduling=base == "async"))


@functools.cache
def block_hasher():
    """What vLLM's engine core gives each request when prefix caching is on (its default)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(BLOCK, hash_fn)


def request(request_id: str, max_tokens: int = MAX_TOKENS, extra_args: Optional[dict] = None):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
    return Request(request_id, list(PROMPT), params, None, block_hasher=block_hasher())


# --- the engine core and the model runner, by hand -----------------------------------------------------


@dataclass
class StepRecord:
    """One processed step, as the driver (the engine and the model runner) knows it."""

    k_chosen: Optional[int]  # K the controller returned just before the step was scheduled
    k_asked: int  # num_spec_tokens_to_schedule: K the drafter drafts at the end of the step
    batch: tuple[str, ...]  # every request the step ran
    verified: dict[str, int]  # request -> drafts verified in the step
    made_with: set[int]  # K the verified drafts of the step's decoding requests were made with
    served: tuple[str, ...] = ()  # the requests whose output vLLM keeps (not finished before it arrived)
    handed_over: bool = False  # the engine core fetched the step's drafts from the model runner
    vllm_drafted: int = 0  # vLLM's own counters for the step (SpecDecodingStats)
    vllm_accepted: int = 0
    seen: list[Any] = field(default_factory=list)  # StepFeedback the controller passed to its policy


def engine_core_post_step():
    """vLLM's own ``EngineCore.post_step`` (the draft hand-over) under vspec's k0-draft-handover patch."""
    from vllm.v1.engine.core import EngineCore

    from vspec_runtime.patches import _base, k0_draft_handover

    return k0_draft_handover._make_post_step(_base.original_of(EngineCore, "post_step"))


class EngineLoop:
    """vLLM's EngineCore.step (sync) or step_with_batch_queue (async: two steps in flight), then its
    post_step, with a model runner that accepts ``ACCEPTS[request id prefix]`` drafts of each request
    and, under sync scheduling, hands back ``draft_len(request id, K)`` drafts (the n-gram drafter may
    find fewer) when the engine core asks for them."""

    def __init__(self, scheduler, draft_len: Callable[[str, int], int] = lambda rid, k: k,
                 on_handover: Callable[[], None] = lambda: None):
        self.scheduler = scheduler
        self.on_handover = on_handover  # what the round trip to the worker costs (a fake clock's advance)
        self.is_async = scheduler.scheduler_config.async_scheduling
        self.draft_len = draft_len
        self.in_flight: deque = deque()
        self.made_with: dict[str, int] = {}  # request -> K its pending drafts were made with
        self.outputs: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, str] = {}
        self.records: list[StepRecord] = []
        self.chosen: list[int] = []  # K the controller returned, per schedule()
        self.stale_outputs = 0  # outputs of requests that had already finished (async)
        self._spy_on_controller()
        # What EngineCore.post_step reads of its engine core; the executor's hand-over is the model runner's.
        self.engine_core = SimpleNamespace(
            scheduler=scheduler, check_for_draft_tokens=True, async_scheduling=self.is_async,
            model_executor=SimpleNamespace(take_draft_token_ids=self.take_draft_token_ids))
        self.post_step = engine_core_post_step()
        self.runner_drafts = None  # drafts the model runner made at the end of the last step

    def _spy_on_controller(self):
        controller = self.scheduler._vspec
        if controller is None:
            return
        choose, observe = controller.choose_gamma, controller.policy.observe

        def choose_gamma(batch_size):
            gamma = choose(batch_size)
            self.chosen.append(gamma)
            return gamma

        def policy_observe(feedback):
            self.records[-1].seen.append(feedback)
            observe(feedback)

        controller.choose_gamma, controller.policy.observe = choose_gamma, policy_observe

    def add(self, *requests):
        for item in requests:
            self.scheduler.add_request(item)

    def run(self, max_steps: int = 200) -> "EngineLoop":
        for _ in range(max_steps):
            if not (self.scheduler.has_requests() or self.in_flight):
                return self
            if self.is_async:
                self.step_async()
            else:
                self.step_sync()
        raise AssertionError(f"requests still running after {max_steps} steps")

    def step_sync(self):
        scheduled = self.scheduler.schedule()
        runner_output, record = self.execute(scheduled)
        self.process(scheduled, runner_output, record)
        self.runner_drafts = self.drafts(scheduled)
        self.post_step(self.engine_core, scheduled.total_num_scheduled_tokens > 0)

    def take_draft_token_ids(self):
        """The executor's hand-over: the drafts made at the end of the last step, for the scheduler."""
        self.records[-1].handed_over = True
        self.on_handover()
        drafts, self.runner_drafts = self.runner_drafts, None
        return drafts

    def step_async(self):
        if self.scheduler.has_requests():
            scheduled = self.scheduler.schedule()
            self.in_flight.appendleft((scheduled, *self.execute(scheduled)))
            if len(self.in_flight) < 2 and (scheduled.total_num_scheduled_tokens > 0 or self.scheduler.has_requests()):
                return
        elif not self.in_flight:
            return
        self.process(*self.in_flight.pop())
        self.post_step(self.engine_core, True)  # under async vLLM hands nothing over here

    def execute(self, scheduled):
        """The model runner: verify each request's drafts, sample, and draft K for the next step."""
        from vllm.v1.outputs import ModelRunnerOutput

        request_ids = list(scheduled.num_scheduled_tokens)
        sampled, verified, made_with = [], {}, set()
        for request_id in request_ids:
            if self.scheduler.requests[request_id].is_prefill_chunk:
                sampled.append([])  # prompt not done yet: nothing sampled
                continue
            drafts = len(scheduled.scheduled_spec_decode_tokens.get(request_id, ()))
            if request_id in self.made_with:
                made_with.add(self.made_with[request_id])
            if drafts:
                verified[request_id] = drafts
            accepted = min(drafts, ACCEPTS[request_id.split("-")[0]])
            sampled.append([TOKEN] * (1 + accepted))
            self.made_with[request_id] = scheduled.num_spec_tokens_to_schedule
        output = ModelRunnerOutput(req_ids=request_ids, req_id_to_index={r: i for i, r in enumerate(request_ids)},
                                   sampled_token_ids=sampled)
        chosen = self.chosen[-1] if self.chosen else None
        return output, StepRecord(chosen, scheduled.num_spec_tokens_to_schedule, tuple(request_ids), verified, made_with)

    def process(self, scheduled, runner_output, record: StepRecord):
        record.served = tuple(rid for rid in record.batch if rid not in self.finish_reasons)
        self.stale_outputs += len(record.batch) - len(record.served)
        self.records.append(record)
        engine_outputs = self.scheduler.update_from_output(scheduled, runner_output)
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                self.outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
                if output.finish_reason is not None:
                    self.finish_reasons[output.request_id] = str(output.finish_reason)
            stats = outputs.scheduler_stats
            if stats is not None and stats.spec_decoding_stats is not None:
                record.vllm_drafted = stats.spec_decoding_stats.num_draft_tokens
                record.vllm_accepted = stats.spec_decoding_stats.num_accepted_tokens

    def drafts(self, scheduled):
        from vllm.v1.outputs import DraftTokenIds

        request_ids = list(scheduled.num_scheduled_tokens)
        k = scheduled.num_spec_tokens_to_schedule
        return DraftTokenIds(request_ids, [[TOKEN] * self.draft_len(rid, k) for rid in request_ids])

    # --- what the controller saw ------------------------------------------------------------------

    @property
    def observed(self) -> list[tuple[StepRecord, Any]]:
        """(step, the controller's feedback) for every processed step that ran requests."""
        pairs = []
        for record in self.records:
            assert len(record.seen) <= 1, "one feedback per step"
            pairs.extend((record, feedback) for feedback in record.seen)
        return pairs


def three_requests():
    return [request(f"{kind}-{index}") for index, kind in enumerate(ACCEPTS)]


def assert_everyone_finished(loop: EngineLoop, requests):
    assert set(loop.finish_reasons) == {r.request_id for r in requests}
    assert set(loop.finish_reasons.values()) == {"length"}
    assert all(len(loop.outputs[r.request_id]) == MAX_TOKENS for r in requests)
    assert not loop.scheduler.requests and not loop.scheduler.running


# --- the tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
def test_the_named_class_becomes_the_one_vllm_resolved(monkeypatch, model_dir, base):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vspec_runtime.scheduler import AdaptiveScheduler, AsyncAdaptiveScheduler

    scheduler = make_scheduler(monkeypatch, model_dir, base)
    assert isinstance(scheduler, AdaptiveScheduler)
    assert isinstance(scheduler, AsyncScheduler) is (base == "async")
    assert type(scheduler) is (AsyncAdaptiveScheduler if base == "async" else AdaptiveScheduler)
    assert scheduler._vspec is not None, "the controller runs over either base"


@pytest.mark.parametrize("base", BASES)
def test_the_controllers_k_reaches_every_step_and_the_drafts_of_the_next(monkeypatch, model_dir, base):
    scheduler = make_scheduler(monkeypatch, model_dir, base)
    loop = EngineLoop(scheduler)
    requests = three_requests()
    loop.add(*requests)
    loop.run()

    ran = [record for record in loop.records if record.batch]
    assert {record.k_asked for record in ran} >= set(SWEEP), "every K of the sweep ran, 0 included"
    # A K change takes effect at once: each step asks the drafter for the K just chosen...
    assert all(record.k_asked == record.k_chosen for record in ran)
    # ...and the next step verifies exactly that many drafts per request (placeholders under async),
    # none after K=0.
    for record in loop.records:
        if record.made_with:
            assert len(record.made_with) == 1, record
            (made_with,) = record.made_with
            assert all(count == made_with for count in record.verified.values()), record
            assert record.verified or made_with == 0, record
    # The engine core fetched the drafts only after steps that drafted (k0-draft-handover skips the
    # round trip after K=0); under async the model runner keeps them and nothing is handed over.
    assert all(record.handed_over == (base == "sync" and record.k_asked > 0) for record in ran)
    assert_everyone_finished(loop, requests)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001  # every reading is a little later: a step's own time
        return self.now


def test_a_drafting_steps_measured_cost_includes_the_draft_handover(monkeypatch, model_dir):
    """The engine core fetches a step's drafts after its output is processed and before the next step
    is scheduled: that round trip is a cost of drafting, skipped after K=0 steps (k0-draft-handover),
    so the controller's interval for the next step includes it, or K>0 would look cheaper than it is
    against K=0. Here the hand-over takes 5 s of a fake clock."""
    scheduler = make_scheduler(monkeypatch, model_dir, "sync")
    clock = scheduler._vspec_clock = FakeClock()
    handover_s = 5.0

    def handover():
        clock.now += handover_s

    loop = EngineLoop(scheduler, on_handover=handover)
    requests = three_requests()
    loop.add(*requests)
    loop.run()

    pairs = [(previous, feedback) for previous, record in zip(loop.records, loop.records[1:]) for feedback in record.seen]
    assert {previous.handed_over for previous, _ in pairs} == {True, False}, "K=0 and K>0 steps both ran"
    for previous, feedback in pairs:
        assert (feedback.interval_ms >= 1000 * handover_s) == previous.handed_over, (previous, feedback)
    assert_everyone_finished(loop, requests)


@pytest.mark.parametrize("base", BASES)
def test_the_controller_sees_what_vllm_counts_and_the_k_that_drafted_it(monkeypatch, model_dir, base):
    scheduler = make_scheduler(monkeypatch, model_dir, base)
    # Under sync scheduling the "one" request's drafter finds a single token (as n-gram lookups do):
    # the controller must count the drafts verified, not the K asked for.
    loop = EngineLoop(scheduler, draft_len=lambda rid, k: min(k, 1) if rid.startswith("one") else k)
    requests = three_requests()
    loop.add(*requests)
    loop.run()

    observed = loop.observed
    assert len(observed) >= 8
    assert len(observed) == len([record for record in loop.records if record.served])
    for record, feedback in observed:
        served = {rid: count for rid, count in record.verified.items() if rid in record.served}
        assert dict(zip(feedback.request_ids, feedback.drafted)) == served, (record, feedback)
        assert (sum(feedback.drafted), sum(feedback.accepted)) == (record.vllm_drafted, record.vllm_accepted)
        for request_id, accepted in zip(feedback.request_ids, feedback.accepted):
            assert accepted == min(record.verified[request_id], ACCEPTS[request_id.split("-")[0]])
        assert feedback.batch_ids == record.served and feedback.batch_size == len(record.served)
        if record.made_with:
            # Attributed to the K that made the verified drafts, not the K chosen since (async
            # chooses the next step's K before this one's output is processed).
            assert {feedback.gamma} == record.made_with, (record, feedback)
        if feedback.stable:
            assert feedback.gamma == record.k_asked
    if base == "async":
        # A request that finished in step N was already scheduled in step N+1; vLLM drops that output,
        # and so does the controller (checked above: it saw exactly what vLLM counted).
        assert loop.stale_outputs > 0
    assert_everyone_finished(loop, requests)


@pytest.mark.parametrize("base", BASES)
def test_only_steps_that_verify_and_draft_with_the_same_k_are_stable(monkeypatch, model_dir, base):
    """Stable steps feed the policy's cost windows: their time must belong to one K. Under async the
    next K is already chosen when a step is observed, so "the current K" is the wrong one to compare."""
    steady = make_scheduler(monkeypatch, model_dir, base, sweep_gammas=[2])
    loop = EngineLoop(steady)
    requests = [request(f"one-{index}") for index in range(2)]
    loop.add(*requests)
    loop.run()
    stable = [feedback for _, feedback in loop.observed if feedback.stable]
    assert stable and all(feedback.gamma == 2 and feedback.drafted == (2, 2) for feedback in stable)
    assert_everyone_finished(loop, requests)

    activation.active_spec.cache_clear()
    alternating = EngineLoop(make_scheduler(monkeypatch, model_dir, base, sweep_gammas=[2, 3]))
    alternating.add(request("one-0"))
    alternating.run()
    assert not [feedback for _, feedback in alternating.observed if feedback.stable]


@pytest.mark.parametrize("base", BASES)
def test_a_policy_fault_freezes_k_and_the_scheduler_serves_on(monkeypatch, model_dir, base, caplog):
    monkeypatch.setenv("VSPEC_FAULT_AFTER_STEPS", "3")
    scheduler = make_scheduler(monkeypatch, model_dir, base)
    loop = EngineLoop(scheduler)
    requests = three_requests()
    loop.add(*requests)
    with caplog.at_level(logging.ERROR, logger="vspec.control"):
        loop.run()

    assert loop.chosen[:3] == list(SWEEP[:3])
    assert set(loop.chosen[3:]) == {GAMMA}, "frozen at the safe K after the fault"
    assert [r for r in caplog.records if "injected policy fault" in r.getMessage() or
            (r.exc_info and "injected policy fault" in str(r.exc_info[1]))], "the fault is logged"
    assert scheduler._vspec.snapshot()["faulted"] is True
    late = [record for record in loop.records[6:] if record.verified]
    assert late and all(set(record.verified.values()) == {GAMMA} for record in late)
    assert_everyone_finished(loop, requests)


@pytest.mark.parametrize("base", BASES)
def test_a_controller_fault_in_the_scheduler_hooks_freezes_k_and_serves_on(monkeypatch, model_dir, base, caplog):
    scheduler = make_scheduler(monkeypatch, model_dir, base)
    loop = EngineLoop(scheduler)
    controller = scheduler._vspec
    calls = []

    def broken_observe(step, idle_after=False):
        calls.append(step)
        if len(calls) > 2:
            raise RuntimeError("controller bug")

    controller.observe_step = broken_observe
    requests = three_requests()
    loop.add(*requests)
    with caplog.at_level(logging.ERROR, logger="vspec.scheduler"):
        loop.run()

    assert scheduler._vspec is None, "the controller is off after its fault"
    assert len([r for r in caplog.records if "freezing K" in r.getMessage()]) == 1
    frozen = {record.k_asked for record in loop.records[len(calls) + 2:] if record.verified or record.made_with}
    assert len(frozen) == 1 and frozen <= set(range(1, GAMMA + 1)), frozen
    assert_everyone_finished(loop, requests)


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize("base", BASES)
def test_what_async_scheduling_cannot_do_is_said_once(monkeypatch, model_dir, base, caplog):
    with caplog.at_level(logging.WARNING, logger="vspec.scheduler"):
        scheduler = make_scheduler(monkeypatch, model_dir, base, per_request=True)
        loop = EngineLoop(scheduler)
        capped = [request(f"all-{index}", extra_args={"vspec_max_draft": 1}) for index in range(2)]
        loop.add(*capped)
        loop.run()

    per_request = _warnings(caplog, "per-request draft lengths")
    caps = _warnings(caplog, "vspec_max_draft")
    if base == "async":
        assert len(per_request) == 1 and "--no-async-scheduling" in per_request[0]
        assert len(caps) == 1 and "--no-async-scheduling" in caps[0]
    else:
        assert per_request == caps == []
        # Synchronous: the client's cap reaches the drafts (at most 1 verified per step).
        assert all(count <= 1 for record in loop.records for count in record.verified.values())
        assert any(record.verified for record in loop.records)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_k0_fast_path_skips_a_model_drafter_only_under_sync_scheduling(asynchronous, caplog, monkeypatch):
    """Under async, vLLM's model runner takes the next step's input tokens from the drafter's pass."""
    from types import SimpleNamespace

    from vspec_runtime.patches import _base, k0_fast_path

    monkeypatch.setattr(_base, "_said", set())  # the once-a-process log lines say again
    ran = []
    propose = k0_fast_path._make_propose(lambda runner, output, sampled, *rest: ran.append(output) or "drafted",
                                         skip_model_drafters=True)
    runner = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle"), use_async_scheduling=asynchronous,
                             input_batch=SimpleNamespace(req_ids=["a"]),
                             cache_config=SimpleNamespace(enable_prefix_caching=True))
    k0_decode = SimpleNamespace(num_spec_tokens_to_schedule=0, scheduled_new_reqs=[], preempted_req_ids=None,
                                num_scheduled_tokens={"a": 1}, scheduled_spec_decode_tokens={},
                                finished_req_ids=set())
    with caplog.at_level(logging.WARNING, logger="vspec.patches"):
        result = propose(runner, k0_decode, [[TOKEN]])
    if asynchronous:
        assert result == "drafted" and ran, "vLLM's own K=0 pass ran"
        assert any("--no-async-scheduling" in r.getMessage() for r in caplog.records)
    else:
        assert not ran and result == [[]]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_the_k0_fast_path_skips_a_prompt_step_drafter_pass_only_without_prefix_caching(prefix_caching, monkeypatch):
    """A K=0 step that admits a request: with prefix caching on, the drafter's prompt pass runs (the
    prompt blocks may serve later requests that draft); off, nobody reuses them and the request never
    drafts inside the cohort, so the pass is skipped and the request is marked stale."""
    from types import SimpleNamespace

    from vspec_runtime.patches import _base, k0_fast_path

    monkeypatch.setattr(_base, "_said", set())  # the once-a-process log lines say again
    ran = []
    propose = k0_fast_path._make_propose(lambda runner, output, sampled, *rest: ran.append(output) or "drafted",
                                         skip_model_drafters=True)
    runner = SimpleNamespace(speculative_config=SimpleNamespace(method="draft_model"), use_async_scheduling=False,
                             input_batch=SimpleNamespace(req_ids=["a", "b"]),
                             cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching))
    k0_prompt = SimpleNamespace(num_spec_tokens_to_schedule=0, scheduled_new_reqs=[SimpleNamespace(req_id="b")],
                                preempted_req_ids=None, num_scheduled_tokens={"a": 1, "b": 12},
                                scheduled_spec_decode_tokens={}, finished_req_ids=set())
    result = propose(runner, k0_prompt, [[TOKEN], [TOKEN]])
    if prefix_caching:
        assert result == "drafted" and ran, "the drafter's prompt pass was skipped under prefix caching"
        assert not getattr(runner, k0_fast_path.STALE)
    else:
        assert not ran and result == [[], []]
        assert getattr(runner, k0_fast_path.STALE) == {"a", "b"}


@pytest.mark.parametrize(("method", "drafts", "next_k", "asynchronous", "recurrent", "plain"), [
    ("ngram", {}, 3, False, False, True),           # n-gram reads no metadata, whatever K comes next
    ("ngram", {"a": [TOKEN]}, 3, False, False, False),  # drafts to verify: the rejection sampler needs it
    ("draft_model", {}, 0, False, False, True),     # sticky K=0: the drafter's pass is skipped
    ("draft_model", {}, 2, False, False, False),    # K comes back: the drafter runs on vLLM's metadata
    ("draft_model", {}, 0, True, False, False),     # async: the drafter runs, so does vLLM's path
    ("ngram", {}, 0, False, True, False),           # recurrent state reads vLLM's per-request draft counts
])
def test_the_k0_fast_path_prepares_inputs_without_spec_metadata_only_when_nothing_reads_it(
        method, drafts, next_k, asynchronous, recurrent, plain, monkeypatch):
    """vLLM takes its speculative branch while the runner has a speculative config: the fast path hides
    it for one call when the step verifies no drafts and its drafter reads no metadata."""
    from types import SimpleNamespace

    from vspec_runtime.patches import _base, k0_fast_path

    monkeypatch.setattr(_base, "_said", set())  # the once-a-process log lines say again
    config = SimpleNamespace(method=method)
    seen = []
    prepare = k0_fast_path._make_prepare_inputs(
        lambda runner, output, counts: seen.append(runner.speculative_config) or "prepared", skip_model_drafters=True)
    runner = SimpleNamespace(speculative_config=config, use_async_scheduling=asynchronous,
                             model_config=SimpleNamespace(has_inner_state=recurrent),
                             cache_config=SimpleNamespace(enable_prefix_caching=True))
    step = SimpleNamespace(num_spec_tokens_to_schedule=next_k, scheduled_new_reqs=[], preempted_req_ids=None,
                           num_scheduled_tokens={"a": 1 + len(drafts.get("a", []))},
                           scheduled_spec_decode_tokens=drafts, finished_req_ids=set())

    assert prepare(runner, step, None) == "prepared"
    assert seen == [None if plain else config]
    assert runner.speculative_config is config, "the runner's config was not put back"
