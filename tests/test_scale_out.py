"""Scale-out through vLLM's own parallelism (docs/scaling.md).

Pure checks first: the layout vspec reads back from vLLM's flags, the one-line refusal (exit 2) of a
layout vLLM would refuse, the CPU core groups that let TP/PP start on a one-node machine, doctor's
layout report, the rank layout and K agreement the scheduler derives from vLLM's own ParallelConfig,
and one /metrics file per data-parallel rank. Then real vLLM on CPU (marker ``vllm``): one TP=2 and
one PP=2 engine per drafting method, K forced to change, greedy output token for token equal to a
single-process target-only run. Data parallelism has no engine test: see the DP section below.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cli_helpers import run_cli
from conftest import run_offline
from vspec_cli import parallel_layout as pl
from vspec_cli.parallel_layout import ParallelLayout

# --- the layout vLLM's flags ask for ----------------------------------------------------------


def test_the_layout_is_read_from_vllms_own_flags():
    assert pl.parse_layout(["--tensor-parallel-size", "2", "-pp=2", "--enforce-eager"]) == \
        ParallelLayout(2, 2, eager=True)
    assert pl.parse_layout(["-dp", "4", "--data-parallel-size-local=2", "--enable-expert-parallel"]) == \
        ParallelLayout(data=4, data_local=2, expert=True)
    assert pl.parse_layout(["-tp", "2", "-tp", "4"]).tensor == 4  # the last one wins, as in argparse
    assert pl.parse_layout(["-tp", "two"]).single  # vLLM rejects it itself
    assert ParallelLayout(tensor=2, data=4, data_local=2).local_ranks == 4


def test_cpu_ranks_get_core_groups_when_numa_nodes_are_fewer():
    """vLLM's auto binding wants a NUMA node per rank ("Not enough allowed NUMA nodes to bind threads
    of 2 local CPUWorkers"); on one node vspec gives each rank its own cores, in vLLM's [DP, PP, TP] order."""
    assert pl.cpu_binding(ParallelLayout(tensor=2), cores=[0, 1], nodes=1) == {pl.CPU_BIND_VARIABLE: "0|1"}
    assert pl.cpu_binding(ParallelLayout(tensor=2, data=2), cores=list(range(8)), nodes=1) == \
        {pl.CPU_BIND_VARIABLE: "0,1|2,3|4,5|6,7"}
    assert pl.cpu_binding(ParallelLayout(tensor=2), cores=[0, 1], nodes=2) == {}  # vLLM's auto binding works
    assert pl.cpu_binding(ParallelLayout(), cores=[0, 1], nodes=1) == {}


def test_a_binding_the_caller_set_is_left_alone(monkeypatch):
    monkeypatch.setenv(pl.CPU_BIND_VARIABLE, "nobind")
    assert pl.cpu_binding(ParallelLayout(tensor=2), cores=[0, 1], nodes=1) == {}


def test_layout_problems_are_vllms_reasons_in_one_line():
    nine_heads = {"num_attention_heads": 9}
    problem = pl.head_problem(ParallelLayout(tensor=2), nine_heads, "target model")
    assert problem == ("--tensor-parallel-size 2 does not divide the 9 attention heads of the target model: "
                       "vLLM refuses it; use one of 1, 3, 9")
    assert pl.head_problem(ParallelLayout(tensor=3), nine_heads, "target model") is None
    # A draft model runs at the target's TP size; an EAGLE head's attention is the target's.
    assert pl.layout_problems(ParallelLayout(tensor=2), {"num_attention_heads": 2}, nine_heads, "draft", False)
    assert not pl.layout_problems(ParallelLayout(tensor=2), {"num_attention_heads": 2}, nine_heads, "eagle", False)
    assert "needs a core of its own" in pl.cpu_core_problem(ParallelLayout(tensor=2, pipeline=2), cores=2)
    assert pl.cpu_core_problem(ParallelLayout(tensor=2), cores=2) is None


@pytest.fixture
def demo_models(demo_model_dir, monkeypatch):
    """The demo model prepared where `vspec serve demo` looks, so its config.json can be read."""
    monkeypatch.setenv("VSPEC_MODEL_DIR", str(demo_model_dir.parent))
    return demo_model_dir


@pytest.mark.parametrize("dry_run", [True, False])
def test_serve_refuses_tp_that_does_not_divide_the_heads_in_one_line(capsys, demo_models, dry_run):
    """The issue's example: SmolLM2 has 9 attention heads; vLLM would fail after loading, with a traceback.
    Without --dry-run nothing is launched either (the refusal comes before the launch)."""
    result = run_cli(capsys, "serve", "demo", *(["--dry-run"] if dry_run else []), "--", "--tensor-parallel-size", "2")
    assert result.exit_code == 2, result
    first = result.stderr.strip().splitlines()[0]
    assert first == ("Error: --tensor-parallel-size 2 does not divide the 9 attention heads of the target model: "
                     "vLLM refuses it; use one of 1, 3, 9")
    assert "Traceback" not in result.stderr


def test_serve_passes_a_layout_that_runs_with_its_core_groups(capsys, tiny_models, tmp_path):
    preset = tmp_path / "tiny.toml"
    preset.write_text(f'method = "ngram"\ntarget_model = "{tiny_models["llama"]}"\n[serving]\ndevice = "cpu"\n')
    result = run_cli(capsys, "serve", str(preset), "--dry-run", "--json", "--", "--tensor-parallel-size", "2")
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["argv"][-2:] == ["--tensor-parallel-size", "2"]
    expected = pl.cpu_binding(ParallelLayout(tensor=2))  # empty on a machine with a NUMA node per rank
    assert {k: v for k, v in plan["env"].items() if k == pl.CPU_BIND_VARIABLE} == expected


# --- what doctor says about a layout ----------------------------------------------------------


def test_doctor_reports_the_layout_and_each_features_support(tiny_models, tmp_path):
    from vspec_cli.doctor_checks import parallel_scope

    preset = tmp_path / "tiny.toml"
    preset.write_text(f'method = "eagle"\ntarget_model = "{tiny_models["llama"]}"\n'
                      f'drafter = "{tiny_models["llama-eagle"]}"\n[serving]\ndevice = "cpu"\n'
                      f'extra_args = ["--enforce-eager"]\n')
    report = parallel_scope(str(preset), None, ("--tensor-parallel-size", "2"))
    assert report["layout"]["tensor"] == 2 and report["layout"]["eager"]  # the preset's args, then the command's
    assert report["moe"] is False and report["k_agreement"] == "per-rank" and report["problems"] == []
    assert set(report["features"]) == set(pl.FEATURES)
    assert report["features"]["adaptive K"]["status"] == "tested"
    assert report["features"]["confidence stop"]["status"] == "expected"
    pipeline = parallel_scope(str(preset), None, ("--pipeline-parallel-size", "2"))
    assert "cannot run speculative decoding" in pipeline["problems"][0]
    assert {f["status"] for f in pipeline["features"].values()} == {"unsupported"}


def test_doctor_json_fails_the_layout_check_naming_vllms_reason(capsys, demo_models):
    result = run_cli(capsys, "doctor", "--preset", "demo", "--json", "--", "-tp", "2")
    report = json.loads(result.stdout)
    check = next(c for c in report["checks"] if c["name"] == "parallel layout")
    assert result.exit_code == 1 and check["status"] == "fail" and "9 attention heads" in check["reason"]
    assert report["parallel"]["describe"] == "TP=2 PP=1 DP=1"
    assert report["parallel"]["features"]["confidence stop"]["status"] == "not applicable"  # n-gram


def test_pipeline_parallel_on_the_cpu_build_is_refused_where_vllm_fails():
    """Measured here (docs/scaling.md): PP=2 with any speculation fails in vLLM 0.32's CPU build, and
    PP=2 with --enforce-eager fails even target-only; PP=2 compiled and target-only runs."""
    assert "cannot run speculative decoding with --pipeline-parallel-size 2" in pl.cpu_pipeline_problem(
        ParallelLayout(pipeline=2), "ngram")
    assert "drop --enforce-eager" in pl.cpu_pipeline_problem(ParallelLayout(pipeline=2, eager=True), "none")
    assert pl.cpu_pipeline_problem(ParallelLayout(pipeline=2), "none") is None
    assert pl.feature_support(ParallelLayout(pipeline=2), "eagle", moe=False)["adaptive K"]["status"] == "unsupported"


def test_serve_refuses_pipeline_parallel_speculation_on_cpu(capsys, tiny_models, tmp_path):
    preset = tmp_path / "tiny.toml"
    preset.write_text(f'method = "ngram"\ntarget_model = "{tiny_models["llama"]}"\n[serving]\ndevice = "cpu"\n')
    result = run_cli(capsys, "serve", str(preset), "--dry-run", "--", "-pp", "2")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0].startswith("Error: vLLM 0.32's CPU build cannot run speculative decoding")


def test_moe_data_parallel_ranks_hold_k_and_dense_ranks_choose_their_own():
    dp = ParallelLayout(data=2)
    assert pl.k_agreement(dp, moe=True) == "fixed" and pl.k_agreement(dp, moe=None) == "unknown"
    assert pl.k_agreement(dp, moe=False) == "per-rank" and pl.k_agreement(ParallelLayout(), moe=True) == "per-rank"
    assert pl.feature_support(dp, "eagle", moe=True)["adaptive K"]["status"] == "off"
    assert pl.feature_support(dp, "ngram", moe=False)["adaptive K"]["status"] == "tested"
    assert pl.is_moe({"num_local_experts": 8}) and pl.is_moe({"num_attention_heads": 2}) is False


# --- the rank each engine core reports -----------------------------------------------------------


def _engine_core_config(**parallel):
    """vLLM's own ParallelConfig, as an engine core holds it (the rest of VllmConfig is not read)."""
    from vllm.config import ParallelConfig

    return SimpleNamespace(parallel_config=ParallelConfig(**parallel))


def test_a_dense_dp_rank_reports_its_rank_and_no_lockstep():
    from vspec_runtime import parallel

    config = _engine_core_config(data_parallel_size=2, data_parallel_rank=1, tensor_parallel_size=2)
    config.parallel_config.reconfigure_for_independent_dp_rank()  # what vLLM does in a dense model's engine core
    assert parallel.rank_layout(config) == {"dp_rank": 1, "dp_lockstep_size": 1, "tp_size": 2, "pp_size": 1}
    assert parallel.rank_layout(_engine_core_config()) == {"dp_rank": 0, "dp_lockstep_size": 1, "tp_size": 1,
                                                           "pp_size": 1}


def test_each_dp_rank_publishes_its_own_snapshot_and_metrics_name_the_ranks(monkeypatch, tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from vspec_runtime import metrics

    monkeypatch.setenv("VSPEC_RUN_DIR", str(tmp_path))
    for rank, gamma in ((0, 3), (1, 1)):
        ranks = {"dp_rank": rank, "dp_lockstep_size": 1, "tp_size": 2, "pp_size": 1}
        metrics.publish({"method": "ngram", "gamma": gamma, "steps": 10 + rank, "ranks": ranks})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["controller.dp1.json", "controller.json"]
    registry = CollectorRegistry()
    registry.register(metrics.VspecCollector())
    text = generate_latest(registry).decode()
    assert "vspec_current_gamma 3.0" in text  # rank 0's series, as before
    assert 'vspec_rank_current_gamma{dp_rank="1"} 1.0' in text
    assert 'vspec_rank_decode_steps_total{dp_rank="1"} 11.0' in text
    assert 'vspec_rank_info{dp_lockstep_size="1",dp_rank="1",pp_size="1",tp_size="2"} 1.0' in text


# --- real vLLM: TP=2 offline, DP=2 served ---------------------------------------------------------

PROMPTS = [
    "one two three one two three one two three one two",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "Paris is the capital of France. Berlin is the capital of",
]
MAX_TOKENS = 32
# K forced through 1, 4, 0, 2 every two steps (an adaptive policy may rightly settle on one K, and
# then the equality would prove little); per-request lengths ride along for ngram and eagle, as in
# tests/test_runtime_integration.py (a trimmed draft model's drafts were all rejected there).
CHANGING_K = {"enabled": True, "policy": "sweep", "sweep_gammas": [1, 4, 0, 2], "control_interval": 2,
              "min_gamma": 0, "gamma0_mode": "sync"}
DRAFTERS = {"ngram": None, "draft": "llama-first-layer", "eagle": "llama-eagle"}
# 0.05 of host memory per worker: on CPU each TP worker and each DP rank takes its own share.
SERVING = {"dtype": "float32", "max_model_len": 512, "gpu_memory_utilization": 0.05, "max_num_seqs": 8, "device": "cpu"}


def _request(tiny_models, method: str, adaptive: dict, overrides: dict) -> dict:
    target = str(tiny_models["llama"])
    drafter = str(tiny_models[DRAFTERS[method]]) if DRAFTERS.get(method) else None
    spec = {"method": method, "target_model": target, "drafter": drafter, "gamma": 4, "adaptive": adaptive,
            "serving": SERVING}
    return {"spec": spec, "target_path": target, "drafter_path": drafter, "chat": False,
            "engine_overrides": {"enforce_eager": True, **overrides},
            "phases": [{"name": "batch", "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "ignore_eos": True}]}


@pytest.fixture(scope="module")
def single_target_only(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("single-target-only")
    return run_offline(_request(tiny_models, "none", {"enabled": False}, {}), folder)


def _token_ids(result: dict) -> list[list[int]]:
    return [out["token_ids"] for phase in result["phases"] for out in phase["outputs"]]


@pytest.mark.vllm
@pytest.mark.parametrize("method", ["ngram", "draft", "eagle"])
def test_tp2_engine_with_changing_k_equals_single_process_target_only(tiny_models, single_target_only, tmp_path,
                                                                      method):
    """One TP=2 engine per drafting method (two worker processes, one scheduler): the controller's K
    reaches both workers, the trace and the snapshot name the ranks, the tokens are one process's."""
    adaptive = dict(CHANGING_K, per_request=method != "draft", trace=str(tmp_path / "trace.jsonl"))
    result = run_offline(_request(tiny_models, method, adaptive, {"tensor_parallel_size": 2}), tmp_path)

    assert _token_ids(result) == _token_ids(single_target_only)
    phase = result["phases"][0]
    assert phase["counters"]["vllm:spec_decode_num_drafts"] > 0, "nothing was drafted: equality would prove nothing"
    chosen = {int(k) for k, steps in phase["selections"].items() if steps}
    assert len(chosen - {0}) > 1, f"K did not change while the batch ran: {chosen}"
    assert result["controller"]["ranks"] == {"dp_rank": 0, "dp_lockstep_size": 1, "tp_size": 2, "pp_size": 1}
    assert all(line["ranks"]["tp_size"] == 2 for line in result["trace"])
    if method != "draft":
        assert result["controller"]["per_request"]["offered_drafts"] > 0


@pytest.mark.vllm
@pytest.mark.e2e
def test_dense_dp2_ranks_each_change_k_and_serve_target_only_tokens(tiny_models, single_target_only, tmp_path):
    """`vspec serve` with --data-parallel-size 2: two engine cores, each with its own scheduler and
    controller (the dp-dynamic-k patch keeps vLLM's per-step K for a dense model). vLLM's offline LLM
    refuses DP > 1, so this is a server; one API server, so /metrics carries vspec's series."""
    from test_e2e_serve import Server, http_get

    trace = tmp_path / "trace.jsonl"
    preset = tmp_path / "tiny-dp.toml"
    preset.write_text(f'method = "ngram"\ntarget_model = "{tiny_models["llama"]}"\ngamma = 4\n'
                      + _toml_table("adaptive", dict(CHANGING_K, trace=str(trace))) + _toml_table("serving", SERVING))
    server = Server([str(preset), "--", "--enforce-eager", "--data-parallel-size", "2", "--api-server-count", "1"],
                    {"VSPEC_HOME": str(tmp_path / "home")}, tmp_path / "server.log")
    try:
        server.wait_healthy()
        outputs = _complete_together(server.base, str(tiny_models["llama"]))
        metrics = http_get(server.base + "/metrics")[1]
    finally:
        server.stop()

    assert outputs == _token_ids(single_target_only)
    assert "vspec patch dp-dynamic-k live" in server.log.read_text()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    for rank in (0, 1):
        chosen = {line["gamma"] for line in lines if line["ranks"]["dp_rank"] == rank}
        assert len(chosen - {0}) > 1, f"DP rank {rank} did not change K on its own: {chosen}"
    assert 'vspec_rank_current_gamma{dp_rank="1"}' in metrics and 'vspec_rank_current_gamma{dp_rank="0"}' in metrics


def _toml_table(name: str, values: dict) -> str:
    return f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def _complete_together(base: str, model: str) -> list[list[int]]:
    """Every prompt at once (greedy), so both DP ranks get requests; token ids in prompt order."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="unused")

    def complete(prompt: str) -> list[int]:
        reply = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
        return list(reply.choices[0].token_ids)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(complete, PROMPTS))
