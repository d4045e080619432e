"""`vspec fit` and the profile format: recovery of known coefficients, clear errors on bad input.

Pure Python and SciPy: no engine. Synthetic samples come from a seeded generator with a known
latency model, so the expected coefficients are exact up to the noise we add.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from cli_helpers import run_cli
from vspec_cli._errors import UserInputError
from vspec_cli.profiling.files import load_profile_file
from vspec_cli.profiling.fit import evaluate, fit_samples, predict_sample
from vspec_cli.profiling.samples import Sample, read_samples
from vspec_runtime.control.latency_profile import LatencyProfile

TARGET = {"alpha": 0.002, "c": 0.9, "delta": 40.0}
DRAFTER = {"alpha": 0.0005, "c": 0.3}
OVERHEAD = {0: 0.0, 1: 1.5, 2: 2.0, 3: 2.4, 4: 3.1}


def true_ms(batch: int, gamma: int, context: int, batched: int, drafter: bool) -> float:
    latency = TARGET["alpha"] * context + TARGET["c"] * batched + TARGET["delta"] + OVERHEAD[gamma]
    if drafter:
        latency += gamma * (DRAFTER["alpha"] * context + DRAFTER["c"] * batch)
    return latency


def synthetic(count: int = 400, *, drafter: bool = False, noise: float = 0.0, outliers: float = 0.0,
              seed: int = 7, batches=(1, 4, 8)) -> list[dict]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        batch, gamma = rng.choice(batches), rng.choice(sorted(OVERHEAD))
        context = batch * rng.randint(50, 1500)
        drafted = [gamma if rng.random() > 0.2 else rng.randint(0, gamma) for _ in range(batch)]
        accepted = [rng.randint(0, d) for d in drafted]
        batched = batch + sum(drafted)
        latency = true_ms(batch, gamma, context, batched, drafter) * (1.0 + rng.gauss(0.0, noise))
        if rng.random() < outliers:
            latency *= 2.5  # a step that waited for another process
        lines.append({
            "batch_size": batch, "gamma": gamma, "stable": True, "interval_ms": round(latency, 4),
            "drafted": sum(drafted), "accepted": sum(accepted), "accepted_per_request": accepted,
            "drafted_per_request": drafted, "committed": sum(accepted) + batch, "context_tokens": context,
            "batched_tokens": batched,
        })
    return lines


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def as_samples(lines: list[dict]) -> list[Sample]:
    keys = ("batch_size", "gamma", "stable", "interval_ms", "context_tokens", "batched_tokens", "drafted",
            "accepted", "committed")
    return [Sample(i + 1, *(line[k] for k in keys)) for i, line in enumerate(lines)]


# --- recovery -----------------------------------------------------------------------------------


def test_recovers_known_coefficients_without_drafter():
    result = fit_samples(as_samples(synthetic()), model_drafter=False)
    target = result.profile.target
    assert target.alpha == pytest.approx(TARGET["alpha"], rel=1e-3)
    assert target.c == pytest.approx(TARGET["c"], rel=1e-3)
    assert target.delta == pytest.approx(TARGET["delta"], rel=1e-3)
    assert result.profile.drafter is None
    for gamma, overhead in OVERHEAD.items():
        assert result.profile.overhead_ms_per_k[gamma] == pytest.approx(overhead, abs=1e-3)
    assert result.heldout_error < 1e-4
    assert result.samples_heldout == 80 and result.samples_train == 320


def test_recovers_known_coefficients_with_a_drafter_model():
    result = fit_samples(as_samples(synthetic(drafter=True)), model_drafter=True)
    profile = result.profile
    assert profile.target.c == pytest.approx(TARGET["c"], rel=1e-3)
    assert profile.drafter.alpha == pytest.approx(DRAFTER["alpha"], rel=1e-3)
    assert profile.drafter.c == pytest.approx(DRAFTER["c"], rel=1e-3)
    assert profile.drafter.delta == 0.0  # per-forward fixed cost is folded into overhead(K)


def test_noise_and_outliers_stay_within_tolerance():
    lines = synthetic(noise=0.03, outliers=0.05)
    result = fit_samples(as_samples(lines), model_drafter=False)
    assert result.profile.target.c == pytest.approx(TARGET["c"], rel=0.05)
    assert result.profile.target.delta == pytest.approx(TARGET["delta"], rel=0.05)
    assert result.samples_trimmed >= 0.8 * 0.05 * result.samples_train  # the slow steps were dropped
    assert result.heldout_error < 0.04


def test_profile_formula_matches_the_fit_predictions():
    lines = synthetic()
    result = fit_samples(as_samples(lines), model_drafter=False)
    for sample in as_samples(lines)[:20]:
        assert predict_sample(result.profile, sample) == pytest.approx(sample.interval_ms, rel=1e-3)
    full = Sample(1, 4, 3, True, 1.0, 2000, 4 * 4)
    assert result.profile.step_ms(4, 3, 2000) == pytest.approx(predict_sample(result.profile, full))


def test_measured_table_picks_the_best_goodput_per_batch():
    lines = synthetic(count=600)
    for line in lines:  # acceptance of every draft: the largest K wins at batch 1, not at batch 8
        line["accepted"] = line["drafted"]
        line["committed"] = line["drafted"] + line["batch_size"]
    table = fit_samples(as_samples(lines), model_drafter=False).table
    assert set(table) == {1, 4, 8}
    assert table[1] == max(OVERHEAD)


def test_max_gamma_refits_for_a_smaller_server():
    result = fit_samples(as_samples(synthetic()), model_drafter=False, max_gamma=2)
    assert result.profile.max_gamma == 2
    assert set(result.profile.overhead_ms_per_k) == {0, 1, 2}
    assert all(k <= 2 for k in result.profile.table.values())


def test_unstable_steps_are_not_fitted():
    lines = synthetic(count=200)
    for line in lines[::2]:
        line["stable"] = False
        line["interval_ms"] *= 10
    result = fit_samples(as_samples(lines), model_drafter=False)
    assert result.samples_usable == 100
    assert result.profile.target.c == pytest.approx(TARGET["c"], rel=1e-3)


# --- rejection ----------------------------------------------------------------------------------


def one_point(count: int = 40, **changes) -> list[dict]:
    line = {"batch_size": 4, "gamma": 0, "stable": True, "interval_ms": 50.0, "drafted": 0, "accepted": 0,
            "committed": 4, "context_tokens": 800, "batched_tokens": 4, **changes}
    return [dict(line) for _ in range(count)]


def test_same_context_and_tokens_everywhere_is_rank_deficient():
    with pytest.raises(UserInputError, match="rank-deficient: every sample has context 800 and batched tokens 4"):
        fit_samples(as_samples(one_point()), model_drafter=False)


def test_one_batch_size_cannot_separate_c_from_the_overheads():
    lines = [line for line in synthetic(batches=(4,)) if True]
    for line in lines:
        line["batched_tokens"] = 4 * (line["gamma"] + 1)  # every draft full length: n follows K
    with pytest.raises(UserInputError, match="one batch size"):
        fit_samples(as_samples(lines), model_drafter=False)


def test_constant_batched_tokens_is_rank_deficient():
    lines = one_point()
    for i, line in enumerate(lines):
        line["context_tokens"] = 100 + 10 * i
    with pytest.raises(UserInputError, match="every sample has batched tokens 4"):
        fit_samples(as_samples(lines), model_drafter=False)


def test_too_few_samples():
    with pytest.raises(UserInputError, match="need at least"):
        fit_samples(as_samples(synthetic(count=5)), model_drafter=False)


def test_no_stable_samples():
    with pytest.raises(UserInputError, match="no stable decode steps"):
        fit_samples(as_samples(one_point(stable=False)), model_drafter=False)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", r"samples\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"samples\.jsonl:2: expected a JSON object, got list"),
        ('{"batch_size": 1}', r"samples\.jsonl:2: missing 'gamma'"),
        (json.dumps(one_point(1, gamma=-1)[0]), r"samples\.jsonl:2: 'gamma' is -1; expected an integer >= 0"),
        (json.dumps(one_point(1, interval_ms="fast")[0]), r"'interval_ms' is 'fast'"),
        (json.dumps(one_point(1, stable="yes")[0]), r"'stable' is 'yes'; expected true or false"),
        ('{"batch_size": 1, "gamma": 0, "stable": true, "interval_ms": NaN, "context_tokens": 1, '
         '"batched_tokens": 1}', r"'interval_ms' is nan"),
    ],
)
def test_malformed_lines_are_one_line_errors(tmp_path, line, message):
    path = write_lines(tmp_path / "samples.jsonl", [synthetic(1)[0], line])
    with pytest.raises(UserInputError, match=message) as caught:
        read_samples(path)
    assert "\n" not in caught.value.message


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        read_samples(tmp_path / "nope.jsonl")
    with pytest.raises(UserInputError, match="is empty"):
        read_samples(write_lines(tmp_path / "empty.jsonl", []))


# --- the command --------------------------------------------------------------------------------


def test_fit_command_writes_a_valid_profile(tmp_path, capsys):
    samples = write_lines(tmp_path / "run.samples.jsonl", synthetic(noise=0.02))
    out = tmp_path / "run.json"
    result = run_cli(capsys, "fit", str(samples), "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "vspec/fit/1"
    written = json.loads(out.read_text())
    profile = LatencyProfile.from_dict(written)
    assert profile.target.c == pytest.approx(TARGET["c"], rel=0.05)
    assert written["meta"]["samples"] == "run.samples.jsonl"
    assert 0 <= written["meta"]["fit"]["heldout_median_ape"] < 0.05
    assert "no manifest" in result.stderr  # method defaulted, and the command said so


def test_fit_command_rejects_rank_deficient_input_with_exit_2(tmp_path, capsys):
    samples = write_lines(tmp_path / "flat.samples.jsonl", one_point())
    result = run_cli(capsys, "fit", str(samples), "-o", str(tmp_path / "p.json"))
    assert result.exit_code == 2
    assert "Error:" in result.stderr and "rank-deficient" in result.stderr
    assert not (tmp_path / "p.json").exists()


def test_fit_command_rejects_malformed_input_with_exit_2(tmp_path, capsys):
    samples = write_lines(tmp_path / "bad.samples.jsonl", ['{"batch_size": 1, "gamma": 0}'])
    result = run_cli(capsys, "fit", str(samples), "-o", str(tmp_path / "p.json"))
    assert result.exit_code == 2
    assert "bad.samples.jsonl:1: missing 'context_tokens'" in result.stderr


def test_show_renders_the_model_and_the_points(tmp_path, capsys):
    samples = write_lines(tmp_path / "run.samples.jsonl", synthetic(noise=0.02))
    out = tmp_path / "run.json"
    assert run_cli(capsys, "fit", str(samples), "-o", str(out)).exit_code == 0
    result = run_cli(capsys, "profile", "show", str(out), "--json", "--plot", str(tmp_path / "fit.png"))
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert {(p["batch_size"], p["gamma"]) for p in shown["points"]} == {(b, k) for b in (1, 4, 8) for k in OVERHEAD}
    assert (tmp_path / "fit.png").stat().st_size > 10_000
    text = run_cli(capsys, "profile", "show", str(out))
    assert "target" in text.stdout and "held-out median absolute error" in text.stdout


def test_show_without_samples_uses_the_stored_medians(tmp_path, capsys):
    samples = write_lines(tmp_path / "run.samples.jsonl", synthetic())
    out = tmp_path / "run.json"
    assert run_cli(capsys, "fit", str(samples), "-o", str(out)).exit_code == 0
    samples.unlink()
    result = run_cli(capsys, "profile", "show", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["points"]) == 15


# --- validation on load ---------------------------------------------------------------------------


def valid_profile() -> dict:
    return {"schema": "vspec-profile/1", "target": dict(TARGET), "drafter": None, "max_gamma": 6,
            "overhead_ms_per_k": {"0": 0.0, "3": 1.0}, "table": {"1": 6, "8": 2}}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.update(extra=1), "profile: unknown key 'extra'"),
        (lambda p: p["target"].update(speed=1), "profile.target: unknown key 'speed'"),
        (lambda p: p["target"].update(c=-0.1), "profile.target.c: got -0.1; must be a finite number >= 0"),
        (lambda p: p["target"].update(delta=float("inf")), "profile.target.delta: got inf"),
        (lambda p: p.update(schema="vspec-profile/9"), "profile.schema"),
        (lambda p: p["table"].update({"4": 9}), "profile.table: entry 4 -> 9"),
    ],
)
def test_profile_validation_is_one_line(tmp_path, change, message):
    document = valid_profile()
    change(document)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(document))
    with pytest.raises(UserInputError, match=message.replace(".", r"\.")) as caught:
        load_profile_file(path)
    assert "\n" not in caught.value.message and caught.value.exit_code == 2


def test_k_above_the_serving_maximum_is_rejected(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(valid_profile()))
    load_profile_file(path, serving_max_gamma=6)
    with pytest.raises(UserInputError, match=r"entry 1 -> 6 is above the server's maximum K \(4\)"):
        load_profile_file(path, serving_max_gamma=4)
    result = run_cli(capsys, "profile", "show", str(path), "--gamma", "4")
    assert result.exit_code == 2 and "above the server's maximum K" in result.stderr


def test_evaluate_reports_heldout_error_of_a_given_profile():
    lines = synthetic()
    profile = fit_samples(as_samples(lines), model_drafter=False).profile
    report = evaluate(profile, as_samples(lines))
    assert report["heldout_error"] < 1e-4 and report["samples_usable"] == 400
