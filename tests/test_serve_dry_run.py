"""`vspec serve --dry-run`: every preset, precedence, `--` passthrough and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import os

import pytest

from cli_helpers import run_cli
from vspec_cli.presets import preset_names
from vspec_runtime.spec import RuntimeSpec


def plan(capsys, *args: str) -> dict:
    result = run_cli(capsys, "serve", *args, "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def spec_of(document: dict) -> RuntimeSpec:
    return RuntimeSpec.from_json(document["env"]["VSPEC_SPEC"])


def speculative_config(argv: list[str]) -> dict | None:
    if "--speculative-config" not in argv:
        return None
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_the_documented_presets_exist():
    assert {"demo", "draft", "eagle", "eagle-relaxed", "draft-adaptive"} <= set(preset_names())


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_resolves_to_a_vllm_command(capsys, preset):
    document = plan(capsys, preset)
    argv, spec = document["argv"], spec_of(document)
    serve_at = argv.index("serve")
    assert argv[0].endswith(("vllm", "python", "python3")) and serve_at in (1, 3)
    config = speculative_config(argv)
    assert config["num_speculative_tokens"] == spec.gamma
    if spec.adaptive_active:
        assert argv[argv.index("--scheduler-cls") + 1] == "vspec_runtime.scheduler.AdaptiveScheduler"
        assert config["num_speculative_tokens_per_batch_size"][0][0] == 1
    else:
        assert "--scheduler-cls" not in argv


def test_demo_preset_is_cpu_ngram_adaptive_up_to_six(capsys):
    document = plan(capsys, "demo")
    spec = spec_of(document)
    assert (spec.method, spec.gamma, spec.adaptive.enabled, spec.adaptive.policy) == ("ngram", 6, True, "online")
    assert document["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert speculative_config(document["argv"])["method"] == "ngram"


def test_relaxed_preset_says_it_changes_outputs(capsys):
    spec = spec_of(plan(capsys, "eagle-relaxed"))
    assert spec.relaxed.enabled and spec.method == "eagle"


def test_precedence_preset_then_config_then_flags(capsys, tmp_path):
    config = tmp_path / "site.toml"
    config.write_text("gamma = 3\n[serving]\nport = 9001\nmax_num_seqs = 4\n")
    document = plan(capsys, "demo", "--config", str(config), "--gamma", "5")
    spec = spec_of(document)
    assert spec.gamma == 5  # flag beats config
    assert spec.serving.port == 9001  # config beats preset
    assert spec.serving.max_num_seqs == 4
    assert spec.ngram_max == 4  # preset value kept
    assert document["argv"][document["argv"].index("--port") + 1] == "9001"


def test_config_from_environment_variable(capsys, tmp_path, monkeypatch):
    config = tmp_path / "env.toml"
    config.write_text("[adaptive]\nhysteresis = 0.2\n")
    monkeypatch.setenv("VSPEC_CONFIG", str(config))
    assert spec_of(plan(capsys, "demo")).adaptive.hysteresis == 0.2


def test_arguments_after_double_dash_reach_vllm_untouched(capsys):
    result = run_cli(capsys, "serve", "demo", "--dry-run", "--json", "--", "--enforce-eager", "--seed", "7")
    argv = json.loads(result.stdout)["argv"]
    assert argv[-3:] == ["--enforce-eager", "--seed", "7"]


def test_no_speculation_drops_drafting_and_controller(capsys):
    document = plan(capsys, "demo", "--no-speculation")
    assert speculative_config(document["argv"]) is None
    assert "--scheduler-cls" not in document["argv"]
    assert spec_of(document).method == "none"


def test_target_model_without_a_preset(capsys, tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    document = plan(capsys, "--target-model", str(model), "--method", "ngram", "--gamma", "2")
    argv = document["argv"]
    assert argv[argv.index("serve") + 1] == str(model)
    assert speculative_config(document["argv"])["num_speculative_tokens"] == 2


def test_adaptive_flags_land_in_the_spec(capsys, tmp_path):
    trace = tmp_path / "trace.jsonl"
    spec = spec_of(plan(capsys, "demo", "--adaptive-policy", "fixed", "--adaptive-min-gamma", "1",
                        "--adaptive-control-interval", "2", "--adaptive-hysteresis", "0.1",
                        "--adaptive-online-window", "16", "--adaptive-online-exploration", "0.05",
                        "--adaptive-trace", str(trace)))
    ad = spec.adaptive
    assert (ad.policy, ad.min_gamma, ad.control_interval, ad.hysteresis, ad.online_window) == ("fixed", 1, 2, 0.1, 16)
    assert ad.online_exploration == 0.05 and ad.trace == str(trace)


def test_no_adaptive_speculation_serves_fixed_k(capsys):
    document = plan(capsys, "demo", "--no-adaptive-speculation")
    assert "--scheduler-cls" not in document["argv"]
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(document["argv"])


def test_device_sets_the_visible_devices_variable(capsys):
    assert plan(capsys, "draft", "--device", "0,1")["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_cpu_build_starts_without_its_broken_aot_cache(capsys, monkeypatch):
    """This machine runs vLLM's CPU wheel: its AOT compile cache cannot be loaded again, so vspec turns
    it off for the engine (a start compiles once, not twice), unless the user chose a value."""
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    assert plan(capsys, "demo")["env"]["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert "VLLM_USE_AOT_COMPILE" not in plan(capsys, "demo")["env"]  # the user's own value stays in force


def test_the_cpu_build_keeps_numba_off_torchs_openmp_threads(capsys, monkeypatch):
    """vLLM's n-gram proposer runs numba's parallel loops; on OpenMP they kept the engine's other cores
    idle (docs/benchmarks.md). vspec picks numba's own work queue unless the user chose a layer."""
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    assert plan(capsys, "demo")["env"]["NUMBA_THREADING_LAYER"] == "workqueue"
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert "NUMBA_THREADING_LAYER" not in plan(capsys, "demo")["env"]


@pytest.mark.parametrize("cpus, reserve", [(1, "0"), (2, "0"), (3, None), (16, None)])
def test_the_cpu_build_gives_the_model_every_core_on_small_hosts(capsys, monkeypatch, cpus, reserve):
    """vLLM's CPU build keeps one core away from the model for its scheduler process; on a 2-core host
    that halves the model's speed (docs/benchmarks.md). vspec turns the reserve off at 2 usable CPUs or
    fewer, leaves vLLM's default on bigger hosts, and never overrides the user's own value."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    result = run_cli(capsys, "serve", "demo", "--dry-run", "--json")
    assert json.loads(result.stdout)["env"].get("VLLM_CPU_NUM_OF_RESERVED_CPU") == reserve
    assert ("VLLM_CPU_NUM_OF_RESERVED_CPU=0" in result.stderr) == (reserve == "0")  # says why vLLM will warn
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in plan(capsys, "demo")["env"]


def test_human_dry_run_prints_environment_and_a_shell_command(capsys):
    result = run_cli(capsys, "serve", "demo", "--dry-run")
    assert result.exit_code == 0
    assert "VSPEC_SPEC" in result.stdout
    assert "--speculative-config '{" in result.stdout  # shell-quoted JSON


BAD_INPUT = [
    (["no-such-preset"], "unknown preset 'no-such-preset'"),
    (["demo", "--gamma", "40"], "gamma: got 40"),
    (["demo", "--method", "magic"], "method: got 'magic'"),
    (["demo", "--adaptive-min-gamma", "7"], "adaptive.min_gamma: got 7; must be <= gamma (6)"),
    (["demo", "--adaptive-policy", "profile"], "policy 'profile' needs a profile file"),
    (["--target-model", "/nonexistent/model-dir"], "/nonexistent/model-dir does not exist"),
    (["demo", "--method", "draft"], "needs a drafter model"),
    (["demo", "--adaptive-policy", "profile", "--adaptive-profile", "/nonexistent/p.json"], "/nonexistent/p.json does not exist"),
]


def test_the_checked_in_demo_profile_is_accepted(capsys):
    spec = spec_of(plan(capsys, "demo", "--adaptive-policy", "profile", "--adaptive-profile", "profiles/demo-cpu.json"))
    assert spec.adaptive.policy == "profile"


@pytest.mark.parametrize("args,message", BAD_INPUT)
def test_bad_input_is_exit_2_with_one_line(capsys, args, message):
    result = run_cli(capsys, "serve", *args, "--dry-run")
    assert result.exit_code == 2, result
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[0].startswith("Error:")


@pytest.mark.parametrize("toml_text,message", [
    ("gamma = 3\nbogus = 1\n", "unknown key 'bogus'"),
    ("[adaptive]\nhysteresis = 'high'\n", "adaptive.hysteresis: got 'high'"),
    ("[serving]\nport = 'eighty'\n", "serving.port: got 'eighty'"),
    ("gamma = [\n", "not valid TOML"),
])
def test_bad_config_file_names_the_file_and_the_key(capsys, tmp_path, toml_text, message):
    config = tmp_path / "bad.toml"
    config.write_text(toml_text)
    result = run_cli(capsys, "serve", "demo", "--config", str(config), "--dry-run")
    assert result.exit_code == 2
    assert message in result.stderr and str(config) in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_is_exit_2(capsys, tmp_path):
    result = run_cli(capsys, "serve", "demo", "--config", str(tmp_path / "absent.toml"), "--dry-run")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_adaptive_k_leaves_async_scheduling_to_vllm(capsys):
    """vspec's scheduler follows whichever scheduling vLLM resolves (tests/test_scheduler_base_classes.py)."""
    for preset in ("eagle", "draft-adaptive", "demo"):
        argv = plan(capsys, preset)["argv"]
        assert "--scheduler-cls" in argv and "--no-async-scheduling" not in argv, preset
    given = run_cli(capsys, "serve", "eagle", "--dry-run", "--json", "--", "--async-scheduling")
    assert given.exit_code == 0 and json.loads(given.stdout)["argv"][-1] == "--async-scheduling"
    assert "async scheduling off" not in given.stderr


@pytest.mark.parametrize(("setting", "feature"), [
    ("adaptive.per_request=true", "per-request draft lengths"),
    ("adaptive.entropy_stop=true", "confidence stop"),
])
def test_features_that_trim_drafts_in_the_scheduler_turn_async_scheduling_off_and_say_why(capsys, setting, feature):
    result = run_cli(capsys, "serve", "eagle", "--set", setting, "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["argv"].count("--no-async-scheduling") == 1
    assert "async scheduling off" in result.stderr and feature in result.stderr
    given = run_cli(capsys, "serve", "eagle", "--set", setting, "--dry-run", "--json", "--", "--no-async-scheduling")
    assert json.loads(given.stdout)["argv"].count("--no-async-scheduling") == 1
    assert "async scheduling off" not in given.stderr  # the user said so: nothing to explain


def test_confidence_stop_turns_async_scheduling_off_with_a_fixed_k_too(capsys):
    argv = plan(capsys, "eagle", "--no-adaptive-enabled", "--set", "adaptive.entropy_stop=true")["argv"]
    assert "--scheduler-cls" not in argv and "--no-async-scheduling" in argv
    assert "--no-async-scheduling" not in plan(capsys, "eagle", "--no-adaptive-enabled")["argv"]
    assert "--no-async-scheduling" not in plan(capsys, "demo", "--no-speculation")["argv"]


def test_async_scheduling_with_a_feature_that_needs_it_off_is_refused(capsys):
    result = run_cli(capsys, "serve", "eagle", "--set", "adaptive.per_request=true", "--dry-run", "--json",
                     "--", "--async-scheduling")
    assert result.exit_code == 2 and "drop --async-scheduling" in result.stderr
    assert "per-request draft lengths" in result.stderr and "Traceback" not in result.stderr


def test_the_engine_kwargs_turn_async_scheduling_off_for_adaptive_k():
    """Bench and profile engines stay synchronous (see vllm_engine_kwargs)."""
    from vspec_cli.launch import vllm_engine_kwargs
    from vspec_runtime.spec import validate_spec

    adaptive = validate_spec({"method": "ngram", "target_model": "t", "adaptive": {"enabled": True}})
    fixed = validate_spec({"method": "ngram", "target_model": "t"})
    assert vllm_engine_kwargs(adaptive, "t", None)["async_scheduling"] is False
    assert "async_scheduling" not in vllm_engine_kwargs(fixed, "t", None)


def test_vllm_args_after_double_dash_without_a_preset_reach_vllm(capsys, tmp_path):
    """`vspec serve --target-model M -- --enforce-eager`: with no preset, the first word after `--` used to
    be taken as the preset name (exit 2, "unknown preset '--enforce-eager'")."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = run_cli(capsys, "serve", "--target-model", str(model), "--method", "ngram", "--dry-run", "--json",
                     "--", "--enforce-eager", "--seed", "3")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["argv"][-3:] == ["--enforce-eager", "--seed", "3"]
