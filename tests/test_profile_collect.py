"""`vspec profile collect`: the sweep policy, the plan, and one real collect run on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import run_cli
from vspec_cli.profiling.collect import CollectSettings, parse_int_list, phase_max_tokens
from vspec_runtime.control import GuardedPolicy, StepFeedback, SweepPolicy, make_policy
from vspec_runtime.control.latency_profile import LatencyProfile
from vspec_runtime.spec import AdaptiveSettings

# --- the sweep policy -------------------------------------------------------------------------------


def test_sweep_cycles_through_the_values_interval_steps_each():
    policy = SweepPolicy((0, 2, 5), control_interval=3)
    chosen = [policy.choose(4, 6).gamma for _ in range(12)]
    assert chosen == [0, 0, 0, 2, 2, 2, 5, 5, 5, 0, 0, 0]
    assert {policy.choose(4, 6).reason for _ in range(5)} == {"sweep"}


def test_sweep_runs_at_the_feasibility_cap():
    policy = SweepPolicy((6,), control_interval=1)
    decision = policy.choose(64, 3)
    assert (decision.gamma, decision.reason) == (3, "infeasible")


def test_sweep_counts_stable_steps_per_k():
    policy = SweepPolicy((1, 3), control_interval=2)
    for gamma, stable in ((1, False), (1, True), (3, True), (3, True)):
        policy.observe(StepFeedback(2, gamma, (gamma,) * 2, (0, 0), 10.0, stable))
    assert policy.summary()["stable_steps"] == {"1": 1, "3": 2}


def test_make_policy_builds_a_guarded_sweep():
    policy = make_policy(AdaptiveSettings(enabled=True, policy="sweep", sweep_gammas=(0, 4), control_interval=5), 6)
    assert isinstance(policy, GuardedPolicy) and isinstance(policy.inner, SweepPolicy)
    assert policy.inner.gammas == (0, 4) and policy.inner.control_interval == 5
    with pytest.raises(ValueError, match="sweep_gammas: got 8; must be <= gamma \\(6\\)"):
        make_policy(AdaptiveSettings(enabled=True, policy="sweep", sweep_gammas=(0, 8)), 6)


@pytest.mark.parametrize("bad", [(), (-1,), (1.5,)])
def test_sweep_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="sweep policy"):
        SweepPolicy(bad, control_interval=2)


# --- the plan (no engine) -----------------------------------------------------------------------------


def test_int_lists():
    assert parse_int_list("0-3,6", "--gammas") == (0, 1, 2, 3, 6)
    assert parse_int_list("8, 1,1", "--batches") == (1, 8)


def test_phases_are_long_enough_for_every_k_at_full_acceptance():
    settings = CollectSettings(gammas=(0, 1, 2), batches=(1,), steps_per_k=4, steps_per_point=6)
    # 6 stable steps need 2 blocks of 4 per K (3 stable each); at full acceptance K gives K+1 tokens.
    assert phase_max_tokens(settings) == 2 * 4 * (1 + 2 + 3)


def collect_flags(target: str, out: Path, *extra: str) -> list[str]:
    return ["profile", "collect", "--target-model", target, "--method", "ngram", "--gamma", "2",
            "--device", "cpu", "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "4",
            "--gpu-memory-utilization", "0.3", "--batches", "1,4", "-o", str(out), *extra]


def test_dry_run_shows_the_plan(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "p.json"
    result = run_cli(capsys, *collect_flags(str(model), out, "--gammas", "0-2", "--dry-run",
                                             "--json"))
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["spec"]["adaptive"]["policy"] == "sweep"
    assert plan["spec"]["adaptive"]["sweep_gammas"] == [0, 1, 2]
    assert plan["spec"]["adaptive"]["samples"] == str((tmp_path / "p.samples.jsonl").resolve())
    assert [(p["batch_size"], p["max_tokens"]) for p in plan["phases"]] == [(1, 144), (4, 144)]  # 3 cycles x 8 steps x (1+2+3)
    assert plan["files"]["manifest"] == str(tmp_path / "p.manifest.json")
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--gammas", "0-4"), "K=4 is above the server's maximum K (gamma = 2)"),
        (("--batches", "1,8"), "8 requests at once exceed max_num_seqs (4)"),
        (("--steps-per-k", "1"), "--steps-per-k: got 1; must be >= 2"),
        (("--gammas", "x"), "--gammas: expected integers"),
        (("--workload", "nope"), "unknown workload 'nope'"),
        (("--method", "none"), "profiling needs a drafting method"),
    ],
)
def test_bad_plans_are_one_line_errors(tmp_path, capsys, extra, message):
    model = tmp_path / "model"
    model.mkdir()
    result = run_cli(capsys, *collect_flags(str(model), tmp_path / "p.json", "--dry-run", *extra))
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr


# --- one real collect run -----------------------------------------------------------------------------


@pytest.mark.vllm
def test_collect_on_a_tiny_model_writes_samples_manifest_and_profile(tiny_models, tmp_path, capsys):
    out = tmp_path / "tiny.json"
    result = run_cli(capsys, *collect_flags(str(tiny_models["llama"]), out, "--gammas", "0-2",
                                             "--steps-per-k", "4", "--steps-per-point", "6", "--enforce-eager",
                                             "--json"))
    assert result.exit_code == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["schema"] == "vspec/profile-collect/1"

    samples = [json.loads(line) for line in (tmp_path / "tiny.samples.jsonl").read_text().splitlines()]
    stable = [s for s in samples if s["stable"]]
    assert {s["gamma"] for s in stable} == {0, 1, 2}
    assert {1, 4} <= {s["batch_size"] for s in stable}

    manifest = json.loads((tmp_path / "tiny.manifest.json").read_text())
    assert manifest["schema"] == "vspec-profile-manifest/1"
    assert manifest["settings"]["gammas"] == [0, 1, 2] and manifest["settings"]["batches"] == [1, 4]
    assert manifest["command"].startswith("vspec profile collect")
    assert manifest["engine"]["engine_starts"] == 1
    assert manifest["versions"]["vspec"] and manifest["hardware"]["cpu_count"]
    assert manifest["fit"]["heldout_median_ape"] is not None

    profile = LatencyProfile.from_dict(json.loads(out.read_text()))
    assert profile.max_gamma == 2 and set(profile.overhead_ms_per_k) == {0, 1, 2}
    assert profile.drafter is None and profile.meta["method"] == "ngram"

    shown = run_cli(capsys, "profile", "show", str(out), "--json")
    assert shown.exit_code == 0, shown.stderr
    assert {p["gamma"] for p in json.loads(shown.stdout)["points"]} == {0, 1, 2}
