"""Real vLLM (CPU, fp32) with tiny models built in the test: the controller changes K and nothing else.

Greedy outputs must be token-identical between target-only, a fixed K and vspec's scheduler with K
changing, for ngram, draft_model and eagle drafting, with prefix caching on as `vspec serve` runs
(one engine runs without it, where the K=0 fast path also skips a model drafter's prompt pass).
Each case is one fresh engine in its own process. The draft model is the target's first layer,
so verification accepts some drafts and rejects others while K changes.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_offline

pytestmark = pytest.mark.vllm

PROMPTS = [
    "one two three one two three one two three one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
]
MAX_TOKENS = 48


def spec(method: str, target: str, drafter: str | None = None, adaptive: dict | None = None,
         gamma: int = 4) -> dict:
    return {
        "method": method,
        "target_model": target,
        "drafter": drafter,
        "gamma": gamma,
        "adaptive": adaptive or {"enabled": False},
        "serving": {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.3,
                    "max_num_seqs": 8, "device": "cpu"},
    }


def generate(tmp_path, engine_spec: dict, target: str, drafter: str | None = None, env_note: str = "",
             batch_sampling: list | None = None, prefix_caching: bool = True) -> dict:
    request = {
        "prefix_caching": prefix_caching,
        "spec": engine_spec,
        "target_path": target,
        "drafter_path": drafter,
        "chat": False,
        "engine_overrides": {"enforce_eager": True},  # skip torch.compile: starts in seconds, same outputs
        "phases": [
            {"name": "batch", "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "ignore_eos": True,
             "sampling": batch_sampling},
            {"name": "single", "prompts": PROMPTS[:1], "max_tokens": MAX_TOKENS, "ignore_eos": True},
        ],
    }
    return run_offline(request, tmp_path)


def token_ids(result: dict) -> list[list[int]]:
    return [out["token_ids"] for phase in result["phases"] for out in phase["outputs"]]


ADAPTIVE = {"enabled": True, "policy": "online", "control_interval": 1, "min_gamma": 0}
# K forced to change inside the measured phases (an adaptive policy may rightly settle at K=0 on a
# useless drafter, and then the equality would prove nothing): 1, 4, 0, 2, ... every 2 steps. K=0 steps
# take the K=0 fast path (vspec_runtime/patches/k0_fast_path.py), and a model drafter's cache must
# still be right when K comes back.
# gamma0_mode "sync" lets K come back after 0 with model drafters (their cache kept current by
# vLLM's K=0 pass); sticky K=0 (REPROBE below) skips the drafter while it holds.
# Per-request draft lengths ride along for ngram and eagle: each request's draft is trimmed to what its
# own acceptance and the measured step cost say pays, under K the sweep changes (one engine serves both
# checks). Not for the draft model: trimmed, its often-wrong drafts were cut to probes that were all
# rejected, and its partial-acceptance check below would prove nothing; it has an engine of its own.
CHANGING_K = {"enabled": True, "policy": "sweep", "sweep_gammas": [1, 4, 0, 2], "control_interval": 2, "min_gamma": 0,
              "gamma0_mode": "sync", "per_request": True}
# Sticky K=0 re-probed after 4 held steps while the batch runs on (then 8, 16: each probe goes back to
# 0): the policy (0, 2, 0, 2, ...) brings K back to requests whose drafter cache the skipped steps
# left behind.
REPROBE = {"enabled": True, "policy": "sweep", "sweep_gammas": [0, 2], "control_interval": 1, "min_gamma": 0,
           "gamma0_reprobe_steps": 4}
PER_REQUEST = {"enabled": True, "policy": "fixed", "per_request": True}
# Client caps through the OpenAI API's vllm_xargs (SamplingParams.extra_args), sent in the draft model's
# changing-K batch phase: the second request opts out of speculation, the third allows one draft token.
CAPS = [{}, {"extra_args": {"vspec_max_draft": 0}}, {"extra_args": {"vspec_max_draft": 1}}, {}]


@pytest.fixture(scope="module")
def target_only(tiny_models, tmp_path_factory):
    target = str(tiny_models["llama"])
    return generate(tmp_path_factory.mktemp("target-only"), spec("none", target), target)


@pytest.fixture(scope="module")
def speculative_run(tiny_models, tmp_path_factory):
    """One engine per (method, mode), shared by the tests below."""
    cache: dict[tuple[str, str], dict] = {}

    def get(method: str, mode: str) -> dict:
        if (method, mode) not in cache:
            folder = tmp_path_factory.mktemp(f"{method}-{mode}")
            target = str(tiny_models["llama"])
            # The draft model is the target's first layer: partly right. A random EAGLE head: almost never.
            drafter = {"ngram": None, "draft": str(tiny_models["llama-first-layer"]),
                       "eagle": str(tiny_models["llama-eagle"])}[method]
            adaptive = {"fixed": None, "changing-k": CHANGING_K, "reprobe": REPROBE, "reprobe-no-prefix-cache": REPROBE,
                        "online": ADAPTIVE, "per-request": PER_REQUEST}[mode]
            if (method, mode) == ("draft", "changing-k"):
                adaptive = dict(adaptive, per_request=False)
            if adaptive:
                adaptive = dict(adaptive, trace=str(folder / "trace.jsonl"), samples=str(folder / "samples.jsonl"))
            result = generate(folder, spec(method, target, drafter, adaptive), target, drafter,
                              batch_sampling=CAPS if (method, mode) == ("draft", "changing-k") else None,
                              prefix_caching=mode != "reprobe-no-prefix-cache")
            samples = folder / "samples.jsonl"
            result["samples"] = [json.loads(line) for line in samples.read_text().splitlines()] if samples.exists() else []
            cache[(method, mode)] = result
        return cache[(method, mode)]

    return get


@pytest.mark.parametrize(("method", "mode"), [
    ("ngram", "fixed"), ("draft", "fixed"), ("eagle", "fixed"),
    ("ngram", "changing-k"), ("draft", "changing-k"), ("eagle", "changing-k"), ("draft", "reprobe"),
    ("draft", "reprobe-no-prefix-cache"),
    ("ngram", "online"),  # the real controller end to end; for equality any K sequence is as good as another
    ("draft", "per-request"),
])
def test_greedy_output_identical_to_target_only(speculative_run, target_only, method, mode):
    result = speculative_run(method, mode)

    assert token_ids(result) == token_ids(target_only)
    assert all(len(ids) == MAX_TOKENS for ids in token_ids(result))
    measured = result["phases"]
    drafts = sum(phase["counters"]["vllm:spec_decode_num_drafts"] for phase in measured)
    if mode != "online":  # online may rightly settle at K=0 on a useless drafter
        assert drafts > 0, "nothing was drafted in the measured phases: equality would prove nothing"
    chosen = {int(k) for phase in measured for k, n in phase["selections"].items() if n}
    if mode == "changing-k":
        assert len(chosen - {0}) > 1, f"K did not change inside the measured phases: {chosen}"
    if mode.startswith("reprobe"):  # the sweep's two values: K=0 held, then brought back by re-probes
        assert chosen == {0, 2}, f"K did not go to 0 and back inside the measured phases: {chosen}"
    if mode == "online":
        assert any(line["gamma"] > 0 for line in result["trace"]), "the controller never drafted"
        # E[K] was read for the requests of the step (batch_acceptance): the scheduler passed their ids.
        assert max(line["acceptance"]["batch_requests"] for line in result["trace"]) == len(PROMPTS)
        assert result["controller"]["steps"] > 0
        assert sum(result["controller"]["selections"].values()) == result["controller"]["steps"]


@pytest.mark.parametrize(("method", "mode", "line"), [
    ("draft", "changing-k", "a step without drafts was sampled without the rejection sampler"),
    ("draft", "reprobe", "the model drafter was skipped in a K=0 decode step"),
    ("draft", "reprobe-no-prefix-cache", "the model drafter was skipped in a K=0 step with prompt tokens"),
    ("ngram", "changing-k", "a step without drafts prepared its inputs without spec-decode metadata"),
    ("draft", "reprobe", "a step without drafts prepared its inputs without spec-decode metadata"),
])
def test_k0_steps_take_the_fast_path(speculative_run, method, mode, line):
    """Steps at K=0 skip the rejection sampler and the spec-decode metadata (and the n-gram drafter; a
    model drafter under sticky K=0); the worker says so once. The outputs of these engines equal target-only's (above)."""
    result = speculative_run(method, mode)
    assert any(step["gamma"] == 0 for step in result["trace"]), "K was never 0"
    assert result["stderr"].count(f"vspec patch k0-fast-path live: {line}") == 1


def test_after_a_k0_step_the_engine_core_skips_the_empty_draft_handover(speculative_run):
    """The draft model under "sync" K=0 runs its pass at K=0 and returns no drafts: the engine core
    does not fetch them (k0-draft-handover); the engine process says so once."""
    result = speculative_run("draft", "changing-k")
    assert any(step["gamma"] == 0 for step in result["trace"]), "K was never 0"
    line = "vspec patch k0-draft-handover live: a step that drafted nothing skipped the draft hand-over"
    assert result["stderr"].count(line) == 1


def test_skipping_the_k0_draft_handover_loses_no_draft(tiny_models, tmp_path, monkeypatch):
    """The same K script (1, 4, 0, 2, ...) with vLLM's hand-over after every step: exactly the same
    drafts verified and accepted, and the same tokens. A skipped hand-over that held real drafts (K
    coming back after 0) would show as fewer drafts verified here.

    Both engines run their core in the test's child process: LLM.generate then queues every request
    of a phase before the first step, so both meet the K script on the same steps. With vLLM's
    engine-core process a step may start before the last request of the batch arrives, and on a
    busy host the two runs then verified different drafts for the same tokens (129 against 132)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    target, drafter = str(tiny_models["llama"]), str(tiny_models["llama-first-layer"])
    engine_spec = spec("draft", target, drafter, dict(CHANGING_K, per_request=False))
    with_patch = generate(tmp_path, engine_spec, target, drafter, batch_sampling=CAPS)
    monkeypatch.setenv("VSPEC_DISABLE_PATCHES", "k0-draft-handover")
    without = generate(tmp_path, engine_spec, target, drafter, batch_sampling=CAPS)

    assert "k0-draft-handover live" in with_patch["stderr"]
    assert "k0-draft-handover live" not in without["stderr"]
    assert token_ids(without) == token_ids(with_patch)
    for counter in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                    "vllm:spec_decode_num_accepted_tokens"):
        assert without["counters"][counter] == with_patch["counters"][counter] > 0, counter


def test_with_prefix_caching_on_a_k0_prompt_step_still_runs_the_drafter(speculative_run):
    """The prompt blocks may serve later requests that draft: their drafter values must be there. The
    two engines run the same K script, so the one with prefix caching met the same K=0 prompt steps."""
    prompt_skip = "skipped in a K=0 step with prompt tokens"
    assert prompt_skip in speculative_run("draft", "reprobe-no-prefix-cache")["stderr"]
    assert prompt_skip not in speculative_run("draft", "reprobe")["stderr"]


def test_reprobe_brings_k_back_without_drafting_from_a_stale_cache(speculative_run):
    """Under sticky K=0 with re-probes, K comes back while the same requests run (no drain): the
    drafter was skipped for them, so their drafts are dropped, not verified (outputs equal target-only
    above). The samples file has one line per verified step: K that drafted, drafts verified."""
    result = speculative_run("draft", "reprobe")
    samples = result["samples"]
    full = [line for line in samples if line["batch_size"] == len(PROMPTS)]
    drafting = [i for i, line in enumerate(full) if line["drafted"] > 0]
    assert drafting, "nothing was drafted for the batch: the test would prove nothing"
    later = full[drafting[0] + 1:]
    first_zero = next(i for i, line in enumerate(later) if line["gamma"] == 0)  # the drafter skipped from here
    probes = [line for line in later[first_zero:] if line["gamma"] > 0]
    assert probes, "K never came back while the batch ran: no re-probe"
    assert all(line["drafted"] == 0 for line in probes), "drafts from a stale drafter cache were verified"


@pytest.mark.parametrize("method", ["ngram", "draft", "eagle"])
def test_per_request_lengths_saw_every_draft_and_reported_them(speculative_run, method):
    """The allocator ran on the drafts of the measured phases (outputs equal target-only above), and
    what it kept is what vLLM verified."""
    result = speculative_run(method, "per-request" if method == "draft" else "changing-k")
    summary = result["controller"]["per_request"]
    assert summary["offered_drafts"] > 0, "the allocator never saw a draft: the equality would prove nothing"
    verified = result["counters"]["vllm:spec_decode_num_draft_tokens"]
    assert 0 < summary["kept_drafts"] <= summary["offered_drafts"]
    assert verified <= summary["kept_drafts"]  # vLLM may drop more (a stop, the token budget), never verify more


def test_client_caps_limit_drafts_per_request(speculative_run):
    """vllm_xargs {"vspec_max_draft": 0} gets a request no drafts at all; 1 gets at most one per step.
    Request ids are "<counter>-<random>", in submission order: the batch phase's four are consecutive."""
    result = speculative_run("draft", "changing-k")
    batch_steps = [line for line in result["samples"] if line["batch_size"] == len(PROMPTS)]
    drafted: dict[int, list[int]] = {}
    for line in batch_steps:
        for request_id, count in zip(line["request_ids"], line["drafted_per_request"]):
            drafted.setdefault(int(request_id.split("-")[0]), []).append(count)
    first = min(drafted)  # the uncapped first prompt drafts (a model drafter always does)
    assert first + 1 not in drafted or not any(drafted[first + 1]), "the opted-out request was drafted for"
    assert drafted[first + 2] and max(drafted[first + 2]) == 1, drafted[first + 2]
    assert max(drafted[first + 3]) > 1 and max(drafted[first]) > 1


def test_sync_k0_keeps_the_model_drafter_running(speculative_run):
    """With gamma0_mode "sync" K comes back after 0, so the drafter's cache must stay current: no skip."""
    assert "the model drafter was skipped" not in speculative_run("draft", "changing-k")["stderr"]


def test_draft_model_is_partly_accepted_while_k_changes(speculative_run):
    """The target's first layer as a draft model agrees with the target sometimes: verification both
    accepts and rejects, so the equality above covers partial acceptance with K changing."""
    counters = speculative_run("draft", "changing-k")["counters"]
    assert 0 < counters["vllm:spec_decode_num_accepted_tokens"] < counters["vllm:spec_decode_num_draft_tokens"]


def test_copy_drafter_drafts_are_all_accepted(tiny_models, tmp_path):
    """A draft model that is the target itself is always right: every drafted token is accepted.

    Where K should settle is not asserted here: a copy costs as much per token as the target, so K=0
    and K=4 tie. tests/test_demo_settle.py checks settling where the answer is clear.
    """
    target = str(tiny_models["llama"])
    adaptive = dict(ADAPTIVE, trace=str(tmp_path / "trace.jsonl"))
    result = generate(tmp_path, spec("draft", target, target, adaptive), target, target)
    counters = result["counters"]
    assert counters["vllm:spec_decode_num_draft_tokens"] > 0, "nothing was drafted"
    assert counters["vllm:spec_decode_num_accepted_tokens"] == counters["vllm:spec_decode_num_draft_tokens"]


def test_policy_fault_freezes_k_and_keeps_serving(tiny_models, tmp_path, monkeypatch):
    target = str(tiny_models["llama"])
    monkeypatch.setenv("VSPEC_FAULT_AFTER_STEPS", "5")
    result = generate(tmp_path, spec("ngram", target, None, dict(ADAPTIVE, trace=str(tmp_path / "t.jsonl"))), target)
    assert all(len(ids) == MAX_TOKENS for ids in token_ids(result)), "the engine stopped answering"
    assert result["controller"]["faulted"] is True
    fault_lines = [line for line in result["stderr"].splitlines() if "vspec policy" in line and "failed in" in line]
    assert len(fault_lines) == 1, fault_lines
    assert "injected policy fault" in result["stderr"]  # the traceback is logged with it
    frozen = {line["gamma"] for line in result["trace"] if line["step"] > 6}
    assert len(frozen) <= 1, f"K kept moving after the fault: {frozen}"
