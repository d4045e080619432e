"""`vspec bench`: policy and workload parsing, bad input, the statistics, and one real bench on tiny models.

The real bench (marked vllm) checks the results document's shape, that the ratios are computed from
the medians it reports, and that strict policies reproduce target-only token for token. No timing
thresholds: on a shared 2-core machine tok/s says nothing about correctness.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from cli_helpers import run_cli
from vspec_cli._errors import UserInputError
from vspec_cli.benchlib import stats
from vspec_cli.benchlib.policies import parse_policies, policy_spec
from vspec_cli.benchlib.runner import Cell, EngineRun, build_cells, rotated
from vspec_cli.workloads import Phase, Workload, load_workload, parse_workloads
from vspec_runtime.spec import validate_spec

BASE = validate_spec({"target_model": "demo", "method": "ngram", "gamma": 6,
                      "adaptive": {"enabled": True, "policy": "online", "hysteresis": 0.1}})


# --- policies -------------------------------------------------------------------------------------

def test_policy_strings_expand_and_keep_order():
    labels = [p.label for p in parse_policies("target-only, fixed:1-3, table:8=1,1=6, online, fixed:2")]
    assert labels == ["target-only", "fixed:1", "fixed:2", "fixed:3", "table:1=6,8=1", "online"]


def test_profile_policy_takes_an_existing_file(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    (policy,) = parse_policies(f"profile:{profile}")
    assert policy.kind == "profile" and policy.profile == str(profile.resolve())


@pytest.mark.parametrize("text", ["bogus", "fixed", "fixed:0", "fixed:3-1", "fixed:x", "fixed:1-99", "table:",
                                  "table:0=2", "table:a=b", "online:3", "profile:/no/such/file.json", ",",
                                  "online:bogus=1", "online:policy=fixed", "online:per_request=true",
                                  "per-request:trace=x.jsonl"])
def test_bad_policy_strings_are_user_errors(text):
    with pytest.raises(UserInputError):
        parse_policies(text)


def test_each_policy_gets_its_own_spec(tmp_path):
    target, fixed, table, online = parse_policies("target-only,fixed:3,table:1=6,8=1,online")
    assert policy_spec(BASE, target).method == "none" and not policy_spec(BASE, target).adaptive_active
    fixed_spec = policy_spec(BASE, fixed)
    assert (fixed_spec.method, fixed_spec.gamma, fixed_spec.adaptive_active) == ("ngram", 3, False)
    table_spec = policy_spec(BASE, table)
    assert table_spec.adaptive.policy == "table" and table_spec.adaptive.table == {1: 6, 8: 1}
    online_spec = policy_spec(BASE, online, trace=tmp_path / "t.jsonl")
    assert online_spec.gamma == 6 and online_spec.adaptive.policy == "online"
    assert online_spec.adaptive.hysteresis == 0.1 and online_spec.adaptive.trace == str(tmp_path / "t.jsonl")


def test_online_settings_put_two_controllers_side_by_side():
    """online:KEY=VALUE changes the adaptive settings of that policy only; the label says how."""
    plain, variant, trimmed = parse_policies(
        "online,online:batch_acceptance=false,hysteresis=0.2,per-request:online_window=8")
    assert variant.label == "online:batch_acceptance=false,hysteresis=0.2"
    assert plain.label == "online" and trimmed.label == "per-request:online_window=8"
    plain_spec, variant_spec, trimmed_spec = (policy_spec(BASE, p) for p in (plain, variant, trimmed))
    assert plain_spec.adaptive.batch_acceptance and plain_spec.adaptive.hysteresis == 0.1
    assert not variant_spec.adaptive.batch_acceptance and variant_spec.adaptive.hysteresis == 0.2
    assert variant_spec.adaptive.policy == "online"
    assert trimmed_spec.adaptive.per_request and trimmed_spec.adaptive.online_window == 8


def test_online_settings_whose_names_hold_digits_are_accepted():
    """Keys such as gamma0_mode or gamma0_reprobe_steps name a digit; the parser once took letters only."""
    (policy,) = parse_policies("online:gamma0_mode=sync,gamma0_reprobe_steps=64")
    spec = policy_spec(BASE, policy)
    assert spec.adaptive.gamma0_mode == "sync" and spec.adaptive.gamma0_reprobe_steps == 64


def test_an_online_setting_the_spec_refuses_names_the_policy():
    (policy,) = parse_policies("online:hysteresis=2")
    with pytest.raises(UserInputError, match="online:hysteresis=2"):
        policy_spec(BASE, policy)


def test_a_table_beyond_the_max_k_is_refused():
    (table,) = parse_policies("table:1=9")
    with pytest.raises(UserInputError, match="table:1=9"):
        policy_spec(BASE, table)


def test_policy_order_rotates_between_repeats():
    policies = parse_policies("target-only,fixed:1,online")
    orders = [[p.label for p in rotated(policies, r)] for r in range(3)]
    assert orders == [["target-only", "fixed:1", "online"], ["fixed:1", "online", "target-only"],
                      ["online", "target-only", "fixed:1"]]


# --- workloads ------------------------------------------------------------------------------------

def test_builtin_workloads_are_deterministic_and_sized_by_batch():
    for name in ("copy", "chat", "code"):
        first, again = load_workload(name).phases(4, 2), load_workload(name).phases(4, 2)
        assert first == again and [len(p.prompts) for p in first] == [4, 4]
        assert len(set(first[0].prompts + first[1].prompts)) == 8  # rounds use different prompts
    mixed = load_workload("mixed").phases(8, 1)
    assert [(p.kind, len(p.prompts)) for p in mixed] == [("copy", 8), ("chat", 8), ("code", 4), ("copy", 1)]
    assert len(set(mixed[0].prompts + mixed[3].prompts)) == 9  # the copy@1 phase copies a passage of its own


def test_same_prompts_rounds_repeat_the_first_round_under_their_own_names():
    for name in ("copy", "mixed", "hetero"):
        rounds = load_workload(name).phases(8, 3, same_prompts=True)
        first = load_workload(name).phases(8, 1)
        per_round = len(first)
        assert [p.prompts for p in rounds] == [p.prompts for p in first] * 3
        assert [p.name.rsplit("#", 1)[1] for p in rounds] == [str(r + 1) for r in range(3) for _ in range(per_round)]


def test_hetero_batches_mix_copy_and_chat_half_and_half():
    from vspec_cli.workloads import CHAT_QUESTIONS, COPY_INSTRUCTION

    for batch in (2, 8, 5):
        (phase,) = load_workload("hetero").phases(batch, 1)
        copies = [p.startswith(COPY_INSTRUCTION) for p in phase.prompts]
        chats = [p in CHAT_QUESTIONS for p in phase.prompts]
        assert sum(copies) == (batch + 1) // 2 and sum(chats) == batch // 2 and all(a or b for a, b in zip(copies, chats))
        assert copies[:2] == [True, False]  # interleaved, not one kind at the front


def test_a_prompt_file_is_a_workload(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    (workload,) = parse_workloads(str(path))
    assert workload.name == "mine" and workload.phases(3, 1)[0].prompts == ("a", "b", "a")
    path.write_text('{"text": "a"}\n')
    with pytest.raises(UserInputError, match="mine.jsonl:1"):
        parse_workloads(str(path))


@pytest.mark.parametrize("args, message", [
    (["--policies", "bogus"], "unknown policy 'bogus'"),
    (["--workload", "nonsense"], "unknown workload 'nonsense'"),
    (["--batch", "0"], "--batch"),
    (["--batch", "1,x"], "--batch"),
])
def test_bad_input_exits_2_with_one_line(capsys, args, message):
    result = run_cli(capsys, "bench", "--preset", "demo", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("Error:")] == \
        [result.stderr.splitlines()[0]]
    assert "Traceback" not in result.stderr


# --- statistics (synthetic runs) -----------------------------------------------------------------

def _cell(name: str = "w", batch: int = 2) -> Cell:
    workload = Workload(name, "", "", lambda b, r: [], 1)
    return Cell(workload, batch, (Phase(f"{name}#1", name, ("p", "q")),))


def _run(policy: str, repeat: int, tokens: int, seconds: float, outputs, drafts=0.0, accepted=0.0,
         selections=None) -> EngineRun:
    phase = {"cell": "w@2", "name": "w#1", "kind": "w", "batch": 2, "elapsed_s": seconds, "started_at": 0.0,
             "ended_at": seconds, "output_tokens": tokens, "selections": selections or {},
             "counters": {"vllm:spec_decode_num_drafts": drafts, "vllm:spec_decode_num_accepted_tokens": accepted}}
    return EngineRun(policy, repeat, 0, ok=True, wall_s=1.0, log="", phases=[phase], outputs=[outputs])


def test_statistics_ratios_acceptance_histogram_and_equality():
    policies = parse_policies("target-only,fixed:1,fixed:3,online")
    same, other = [[1, 2], [3, 4]], [[1, 2], [3, 5]]
    runs = [
        _run("target-only", 0, 100, 10.0, same), _run("target-only", 1, 100, 5.0, same),  # 10 and 20 tok/s
        _run("fixed:1", 0, 100, 4.0, same, drafts=10, accepted=5), _run("fixed:1", 1, 100, 4.0, same),
        _run("fixed:3", 0, 100, 2.0, same, drafts=10, accepted=20), _run("fixed:3", 1, 100, 2.5, same),
        _run("online", 0, 100, 2.5, same, drafts=4, accepted=4, selections={"3": 6, "1": 2}),
        _run("online", 1, 100, 2.5, other, selections={"3": 2}),
    ]
    (cell,) = stats.summarise(policies, [_cell()], runs)
    rows = cell["policies"]
    assert rows["target-only"]["tok_s_median"] == pytest.approx(15.0)
    assert rows["target-only"]["ratio_target_only"] == pytest.approx(1.0)
    assert cell["best_fixed"] == "fixed:3"
    assert rows["fixed:3"]["tok_s_median"] == pytest.approx(45.0)  # median of 50 and 40
    assert rows["online"]["ratio_target_only"] == pytest.approx(40.0 / 15.0)
    assert rows["online"]["ratio_best_fixed"] == pytest.approx(40.0 / 45.0)
    assert rows["fixed:1"]["acceptance_length"] == pytest.approx(1.5)
    assert rows["fixed:1"]["k_fixed"] == 1 and rows["fixed:1"]["k_histogram"] is None
    assert rows["online"]["k_histogram"] == {"1": 2, "3": 8}
    assert rows["fixed:3"]["matches_target_only"] is True
    assert rows["online"]["mismatch_rate"] == pytest.approx(0.25) and rows["online"]["matches_target_only"] is False
    # Two paired rounds as far apart as these cannot resolve a target: never called met or missed.
    found = {(c["check"], c["verdict"], c["ok"]) for c in stats.checks(policies, [cell])}
    assert found == {("x best fixed K >= 0.98", "not resolved", None), ("x target-only >= 0.97", "not resolved", None)}
    assert rows["online"]["ratio_online"] == pytest.approx(1.0)
    assert rows["online"]["paired_target_only"]["ratio"] == pytest.approx(math.sqrt(4.0 * 2.0))  # rounds: 4x, 2x


def _rounds_run(policy: str, seconds_per_round: list[float], tokens: int = 100) -> EngineRun:
    """One interleaved repeat of one policy: a phase per round, all in cell w@2."""
    phases = [{"cell": "w@2", "name": f"w#{r + 1}", "kind": "w", "batch": 2, "round": r, "elapsed_s": seconds,
               "started_at": 0.0, "ended_at": seconds, "output_tokens": tokens, "selections": {}, "counters": {}}
              for r, seconds in enumerate(seconds_per_round)]
    return EngineRun(policy, 0, 0, ok=True, wall_s=1.0, log="", phases=phases, outputs=[[[1]]] * len(phases))


@pytest.mark.parametrize(("online_factor", "verdict"), [(1.10, "met"), (0.90, "missed"), (0.98, "not resolved")])
def test_paired_rounds_give_intervals_and_three_verdicts(online_factor, verdict):
    """The machine's speed drifts by 2x across rounds; the pairs cancel it and resolve a 10% difference."""
    policies = parse_policies("target-only,fixed:1,fixed:3,online")
    drift = [1.0, 1.4, 0.7, 2.0, 1.1, 0.9, 1.6, 0.8]
    jitter = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99]  # within-round noise of the online policy
    runs = [_rounds_run("target-only", [2.0 * d for d in drift]), _rounds_run("fixed:1", [1.5 * d for d in drift]),
            _rounds_run("fixed:3", [1.0 * d for d in drift]),
            _rounds_run("online", [d * j / online_factor for d, j in zip(drift, jitter)])]
    (cell,) = stats.summarise(policies, [_cell()], runs)
    online = cell["policies"]["online"]
    assert cell["best_fixed"] == "fixed:3"
    interval = online["paired_best_fixed"]
    assert interval["pairs"] == 8 and interval["low"] < interval["ratio"] < interval["high"]
    assert interval["ratio"] == pytest.approx(online_factor, rel=0.01)
    assert interval["high"] / interval["low"] < 1.04, "the drift must cancel in the pairs"
    assert cell["policies"]["fixed:3"]["paired_best_fixed"]["ratio"] == pytest.approx(1.0)
    found = {c["check"]: c["verdict"] for c in stats.checks(policies, [cell]) if c["policy"] == "online"}
    assert found["x best fixed K >= 0.98"] == verdict
    assert found["x target-only >= 0.97"] == "met"  # about 2x target-only


def test_pairs_needed_for_two_percent_follow_the_spread():
    from vspec_cli.benchlib import paired

    assert paired.rounds_for(0.0198, 0.02) == 4  # sd of the log ratio ~2%: (1.96 * 1)^2
    assert paired.rounds_for(0.05, 0.02) > paired.rounds_for(0.03, 0.02)
    assert paired.verdict({"ratio": 1.0, "low": None, "high": None}, 0.98) == "not resolved"
    assert paired.verdict(None, 0.98) is None


@pytest.mark.parametrize(("profile_seconds", "ok"), [(2.5, True), (2.55, True), (2.6, False)])
def test_a_profile_policy_is_checked_against_online(tmp_path, profile_seconds, ok):
    # Issue 6's bar: a measured profile should do within 2% of learning online.
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    policies = parse_policies(f"online,profile:{profile}")
    same = [[1, 2], [3, 4]]
    runs = [_run("online", 0, 100, 2.5, same), _run(f"profile:{profile}", 0, 100, profile_seconds, same)]
    (cell,) = stats.summarise(policies, [_cell()], runs)
    assert cell["policies"][f"profile:{profile}"]["ratio_online"] == pytest.approx(2.5 / profile_seconds)
    mine = [c for c in stats.checks(policies, [cell]) if c["check"] == "x online >= 0.98"]
    assert [c["policy"] for c in mine] == [f"profile:{profile}"]
    # The point ratio is reported; one paired round has no interval, so it resolves nothing.
    assert (mine[0]["value"] >= 0.98) is ok and mine[0]["verdict"] == "not resolved"


def _cells_run(policy: str, seconds: dict[str, list[float]], repeat: int = 0) -> EngineRun:
    """One interleaved repeat of one policy over several cells: cell key -> seconds per round."""
    phases = [{"cell": cell, "name": f"{cell}#{r + 1}", "kind": "w", "batch": 2, "round": r, "elapsed_s": sec,
               "started_at": 0.0, "ended_at": sec, "output_tokens": 100, "selections": {}, "counters": {}}
              for cell, rounds in seconds.items() for r, sec in enumerate(rounds)]
    return EngineRun(policy, repeat, 0, ok=True, wall_s=1.0, log="", phases=phases, outputs=[[[1]]] * len(phases))


def _four_cells_with_online_two_percent_ahead(repeat: int = 0) -> tuple[list, list[Cell], list[EngineRun]]:
    """Four cells whose speed-ups differ (copy 2x target-only, chat 0.9x), each drifting 2x across six
    rounds, and online 2% ahead of fixed:3 in each with +-2.5% noise of its own per round."""
    policies = parse_policies("target-only,fixed:3,online")
    cells = [_cell(name) for name in ("copy", "code", "chat", "mixed")]
    speed_up = {"copy@2": 2.0, "code@2": 1.2, "chat@2": 0.9, "mixed@2": 1.4}
    drift = [1.0, 1.4, 0.7, 2.0, 1.1, 0.9]
    jitter = [1.025, 0.975, 1.02, 0.98, 1.0, 1.0]
    fixed = {cell: [d / up for d in drift] for cell, up in speed_up.items()}
    online = {cell: [f / 1.02 * j for f, j in zip(rounds, jitter)] for cell, rounds in fixed.items()}
    runs = [_cells_run("target-only", {cell: drift for cell in speed_up}, repeat),
            _cells_run("fixed:3", fixed, repeat), _cells_run("online", online, repeat)]
    return policies, cells, runs


def test_pooled_over_cells_resolves_a_two_percent_lead_no_single_cell_does():
    policies, cells, runs = _four_cells_with_online_two_percent_ahead()
    summaries = stats.summarise(policies, cells, runs)
    for cell in summaries:
        per_cell = cell["policies"]["online"]["paired_best_fixed"]
        assert per_cell["low"] < 1.0 < per_cell["high"], f"{cell['cell']} alone should not resolve 2%"
    pooled = {(p["policy"], p["reference"]): p for p in stats.pooled(summaries, runs)}
    lead = pooled[("online", "best_fixed")]
    assert lead["pairs"] == 24 and lead["cells"] == 4
    assert lead["ratio"] == pytest.approx(1.02, rel=0.002)
    assert 1.0 < lead["low"] < lead["ratio"] < lead["high"] < 1.04
    # The cells' own speed-ups (2x on copy, 0.9x on chat) are what is measured, not noise: they move
    # the pooled ratio to target-only but do not widen its interval beyond the rounds' own spread.
    against_target = pooled[("online", "target_only")]
    geometric_mean_speed_up = math.exp(statistics.fmean(math.log(u * 1.02) for u in (2.0, 1.2, 0.9, 1.4)))
    assert against_target["ratio"] == pytest.approx(geometric_mean_speed_up, rel=0.002)
    assert against_target["high"] / against_target["low"] < 1.04
    # A policy is never pooled against itself as a reference; the best fixed K is, at ratio 1.
    assert ("online", "online") not in pooled and ("target-only", "target_only") not in pooled
    assert pooled[("fixed:3", "best_fixed")]["ratio"] == pytest.approx(1.0)


def test_pooled_lines_read_back_from_results_json_and_add_up_over_runs(tmp_path):
    import subprocess
    import sys

    from vspec_cli.benchlib import report

    policies, cells, runs = _four_cells_with_online_two_percent_ahead()
    summaries = stats.summarise(policies, cells, runs)
    folders = []
    for name in ("run-a", "run-b"):
        folder = tmp_path / name
        folder.mkdir()
        document = {"cells": summaries, "runs": [run.record() for run in runs]}
        (folder / "results.json").write_text(json.dumps(document))
        folders.append(str(folder))
    read_back = stats.pooled(summaries, [EngineRun.from_record(r) for r in document["runs"]])
    assert read_back == stats.pooled(summaries, runs)
    (line,) = [line for line in report.pooled_lines({"pooled": read_back}) if line.startswith("online:")]
    assert "x best fixed K 1.020x [" in line and line.endswith("(24 pairs in 4 cells)")

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "pool_runs.py"
    done = subprocess.run([sys.executable, str(script), *folders], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (both,) = [line for line in done.stdout.splitlines() if line.startswith("online:")]
    assert "x best fixed K 1.020x [" in both and both.endswith("(48 pairs in 8 cells)")
    missing = subprocess.run([sys.executable, str(script), str(tmp_path / "nowhere")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "no results.json in" in missing.stderr


def test_a_single_cell_bench_reports_no_pooled_lines():
    policies, cells, runs = _four_cells_with_online_two_percent_ahead()
    (only,) = stats.summarise(policies, cells[:1], runs)
    assert stats.pooled([only], runs) == []


def test_targets_whose_reference_did_not_run_are_left_out():
    """A K=0 bench (target-only, table:1=0, online) has no fixed K: no "x best fixed K" lines at all."""
    policies, cells, runs = _four_cells_with_online_two_percent_ahead()
    runs = [run for run in runs if run.policy != "fixed:3"]
    policies = [p for p in policies if p.label != "fixed:3"]
    found = {c["check"] for c in stats.checks(policies, stats.summarise(policies, cells, runs))}
    assert found == {"x target-only >= 0.97"}


def test_failed_runs_leave_gaps_not_crashes():
    policies = parse_policies("target-only,fixed:2")
    failed = EngineRun("fixed:2", 0, 1, ok=False, wall_s=1.0, log="", error="boom")
    (cell,) = stats.summarise(policies, [_cell()], [_run("target-only", 0, 10, 1.0, [[1], [2]]), failed])
    assert cell["policies"]["fixed:2"]["tok_s_median"] is None
    assert cell["policies"]["fixed:2"]["matches_target_only"] is None and cell["best_fixed"] is None


def _phased_run(policy: str, seconds: dict[str, float], rounds: int = 4) -> EngineRun:
    """One interleaved repeat of one policy in a mixed cell: per round, phases copy@8, chat@8 and a
    second copy@8 (mixed@1 runs copy@1 twice a round), 100 tokens each."""
    jitter = [1.0, 1.02, 0.97, 1.01]
    phases = [{"cell": "mixed@8", "name": f"mixed:{name.split('/')[0]}#{r + 1}", "kind": "mixed", "batch": 8,
               "round": r, "elapsed_s": s * jitter[r % 4], "started_at": 0.0, "ended_at": 1.0,
               "output_tokens": 100, "selections": {}, "counters": {}}
              for r in range(rounds) for name, s in seconds.items()]
    return EngineRun(policy, 0, 0, ok=True, wall_s=1.0, log="", phases=phases, outputs=[[[1]]] * len(phases))


@pytest.mark.parametrize(("chat_at_k0", "reachable", "shown"), [(0.5, False, "out of reach"), (0.2, True, None)])
def test_mixed_cells_report_the_hindsight_best_k_per_phase(chat_at_k0, reachable, shown):
    """The oracle runs each phase at its fastest fixed choice: copy at K=3, chat at K=0 (target-only).
    When even that stays below the 1.10x target, the verdict says the target is out of reach."""
    from vspec_cli.benchlib.report import checks_lines, markdown

    policies = parse_policies("target-only,fixed:1,fixed:3,online")
    runs = [_phased_run("target-only", {"copy@8": 2.0, "chat@8": chat_at_k0, "copy@8/2": 2.0}),
            _phased_run("fixed:1", {"copy@8": 1.5, "chat@8": 0.9, "copy@8/2": 1.5}),
            _phased_run("fixed:3", {"copy@8": 1.0, "chat@8": 0.6, "copy@8/2": 1.0}),
            _phased_run("online", {"copy@8": 1.0, "chat@8": 0.6, "copy@8/2": 1.0})]
    mixed = Cell(Workload("mixed", "", "", lambda b, r: [], 1), 8, ())
    (cell,) = stats.summarise(policies, [mixed], runs)
    oracle = cell["phase_oracle"]
    assert cell["best_fixed"] == "fixed:3"
    assert oracle["ratio"] == pytest.approx(2.6 / (2.0 + min(0.6, chat_at_k0)), rel=0.02)
    assert oracle["best_per_phase"] == {"mixed:chat@8": {"target-only" if chat_at_k0 < 0.6 else "fixed:3": 4},
                                        "mixed:copy@8": {"fixed:3": 4}, "mixed:copy@8 (2)": {"fixed:3": 4}}
    check = next(c for c in stats.checks(policies, [cell]) if c["check"].endswith("on mixed"))
    assert check["reachable"] is reachable and check["verdict"] == "missed"  # online = fixed:3 here
    line = next(line for line in checks_lines([check]))
    assert (shown in line) if shown else ("out of reach" not in line)
    document = {"settings": {"target_model": "t", "method": "ngram", "gamma": 3, "dtype": "float32", "rounds": 4,
                             "max_tokens": 64, "repeats": 1},
                "machine": {"cpu": "c", "usable_cpus": 2, "memory_gib": 1}, "versions": {}, "command": "vspec bench",
                "started": "", "finished": "", "driver": "offline", "cells": [cell], "checks": [check], "runs": runs[:0],
                "files": {}}
    assert "the best fixed K per phase, in hindsight" in markdown(document)


def test_a_stationary_cell_has_no_phase_oracle():
    policies = parse_policies("target-only,fixed:1,fixed:3")
    runs = [_rounds_run("target-only", [2.0] * 4), _rounds_run("fixed:1", [1.5] * 4), _rounds_run("fixed:3", [1.0] * 4)]
    (cell,) = stats.summarise(policies, [_cell()], runs)
    assert cell["phase_oracle"] is None


def test_cells_are_workload_by_batch():
    cells = build_cells(parse_workloads("copy,chat"), [1, 8], rounds=2)
    assert [c.key for c in cells] == ["copy@1", "copy@8", "chat@1", "chat@8"]
    assert all(len(c.phases) == 2 for c in cells)


def test_every_engine_is_warmed_on_the_timed_prompts_and_every_k_down_to_batch_one(tmp_path):
    """A first visit to a prompt or a K costs more than later ones (new kernel shapes): whoever paid it
    inside a timed round would look slower for it, so every engine meets them all before round one."""
    from vspec_cli.benchlib.interleave import TARGET_ENGINE, VSPEC_ENGINE, plan_engines, warm_up_phases
    from vspec_cli.benchlib.runner import BenchPlan

    base = validate_spec({"target_model": "demo", "method": "ngram", "gamma": 3})
    cells = build_cells(parse_workloads("copy,chat"), [1, 8], rounds=2, same_prompts=True)
    plan = BenchPlan(base, "/target", None, parse_policies("target-only,fixed:1,online"), cells, repeats=1,
                     max_tokens=32, ignore_eos=False, out_dir=tmp_path)
    layout = plan_engines(plan, repeat=0)
    labels = list(layout.requests[VSPEC_ENGINE]["bench_policies"])
    assert labels[0] == "warm-up:K=0" and labels[-2:] == ["fixed:1", "online"]  # starts on no measured policy
    timed_prompts = [phase["prompts"] for phase in plan.phase_requests()]
    timed_prompts = [prompts for i, prompts in enumerate(timed_prompts) if prompts not in timed_prompts[:i]]
    assert len(timed_prompts) == 4  # rounds repeat their cell's prompts (--prompts same): each set once
    for engine, expected_labels in ((TARGET_ENGINE, [None]), (VSPEC_ENGINE, [f"warm-up:K={k}" for k in range(4)])):
        work = warm_up_phases(plan, layout.warm_up_gamma.get(engine))
        prefills = [phase for phase, _ in work if phase["kind"] != "warm-up"]
        assert [phase["prompts"] for phase in prefills] == timed_prompts
        assert all(phase["max_tokens"] == 2 for phase in prefills)
        drains = [(phase, label) for phase, label in work if phase["kind"] == "warm-up"]
        assert [label for _, label in drains] == expected_labels
        for phase, _ in drains:  # eight requests that stop one after another: batches 8, 7, ..., 1
            lengths = [entry["max_tokens"] for entry in phase["sampling"]]
            assert len(phase["prompts"]) == 8 and len(set(lengths)) == 8 and phase["ignore_eos"]


# --- one real bench --------------------------------------------------------------------------------

# Repetitive prompts: a random tiny model then gives n-gram matches, so something is drafted. Min K is 1:
# with 0 allowed, online may measure K=0 as best (a random model accepts almost nothing) and pick it on
# exactly the few steps where n-gram would have found a match (CI saw zero drafts once).
TINY_PROMPTS = ["one two three one two three one two three one two",
                "The quick brown fox jumps over the lazy dog. The quick brown fox"]


@pytest.mark.vllm
@pytest.mark.parametrize(("mode", "policies"), [("interleaved", "target-only,fixed:1,fixed:3,online"),
                                                ("engines", "target-only,online")])
def test_small_bench_on_tiny_models(capsys, tiny_models, tmp_path, mode, policies):
    """interleaved (the default): one vspec engine switches between labelled policies round by round
    beside a target-only engine; engines: a fresh engine per policy (the old method)."""
    out = tmp_path / "bench"
    prompts = tmp_path / "tiny.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in TINY_PROMPTS))
    result = run_cli(
        capsys, "bench", "--target-model", str(tiny_models["llama"]), "--method", "ngram", "--gamma", "3",
        "--dtype", "float32", "--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "4",
        "--gpu-memory-utilization", "0.3", "--adaptive-control-interval", "1", "--adaptive-min-gamma", "1",
        "--policies", policies, "--mode", mode, "--workload", str(prompts), "--batch", "2", "--rounds", "2",
        "--max-tokens", "24", "--ignore-eos", "--repeats", "1", "--enforce-eager", "--out", str(out), "--json",
        "--step-samples",
    )
    assert result.exit_code == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document == json.loads((out / "results.json").read_text()) | {"schema": document["schema"]}
    assert document["schema"] == "vspec/bench/1"
    assert {"command", "versions", "machine", "settings", "policies", "workloads", "cells", "checks", "runs",
            "files", "pooled"} <= set(document)
    assert document["pooled"] == []  # one cell: its own intervals say it all
    assert document["command"].startswith("vspec bench ") and f"--policies {policies}" in document["command"]
    assert document["versions"]["vllm"] and document["machine"]["cpu_count"]
    labels = policies.split(",")
    assert [p["label"] for p in document["policies"]] == labels and document["settings"]["mode"] == mode
    assert all(p["strict"] for p in document["policies"])
    assert all(run["ok"] for run in document["runs"]) and len(document["runs"]) == len(labels)

    (cell,) = document["cells"]
    assert (cell["cell"], cell["workload"], cell["batch"]) == ("tiny@2", "tiny", 2)
    target, online = cell["policies"]["target-only"], cell["policies"]["online"]
    assert target["ratio_target_only"] == pytest.approx(1.0)
    assert online["ratio_target_only"] == pytest.approx(online["tok_s_median"] / target["tok_s_median"])
    for row in (target, online):
        assert row["output_tokens"] == 2 * 2 * 24  # batch 2, 2 rounds, ignore_eos
        assert row["tok_s_min"] <= row["tok_s_median"] <= row["tok_s_max"]
        assert math.isfinite(row["tok_s_median"]) and row["tok_s_median"] > 0
        assert row["matches_target_only"] is True and row["mismatch_rate"] == 0.0
        assert row["sequences_compared"] == 4
    assert online["drafts"] > 0 and online["acceptance_length"] == pytest.approx(
        1 + online["accepted_tokens"] / online["drafts"])
    assert online["k_histogram"] and sum(online["k_histogram"].values()) > 0
    assert all(1 <= int(k) <= 3 for k in online["k_histogram"])  # --adaptive-min-gamma 1, --gamma 3
    assert target["k_histogram"] is None and target["acceptance_length"] is None
    assert online["paired_target_only"]["pairs"] == 2  # one repeat, two rounds
    if mode == "interleaved":
        # Constant-K policies ran through vspec's scheduler in the same engine as online: each label's
        # steps ran at its own K, so the switch between rounds really happened.
        for k in (1, 3):
            row = cell["policies"][f"fixed:{k}"]
            assert set(row["k_histogram"]) == {str(k)} and row["drafts"] > 0 and row["matches_target_only"]
        orders = {tuple(p["order_position"] for p in run["phases"]) for run in document["runs"]}
        assert len(orders) > 1, "every policy ran at the same place in every round"
        # Before the first timed round the vspec engine drafted at every K from 0 to 3, down to batch 1,
        # under warm-up labels that no row of the report counts.
        trace = [json.loads(line) for line in (out / "traces" / "vspec-r1.jsonl").read_text().splitlines()]
        warm = [line for line in trace if line["policy"].startswith("warm-up:")]
        first_timed = min(line["time"] for line in trace if not line["policy"].startswith("warm-up:"))
        assert warm and max(line["time"] for line in warm) < first_timed
        assert {(line["policy"], line["gamma"]) for line in warm} == {(f"warm-up:K={k}", k) for k in range(4)}
        assert {line["batch_size"] for line in warm if line["policy"] == "warm-up:K=3"} == {1, 2}
        # --step-samples: every verified step under its label; each label's steps commit exactly the
        # tokens its row counts, and a constant-K label's stable steps ran at its K.
        samples = [json.loads(line) for line in (out / "traces" / "vspec-r1.samples.jsonl").read_text().splitlines()]
        for label in ("fixed:1", "fixed:3", "online"):
            steps = [line for line in samples if line.get("policy") == label]
            assert sum(line["committed"] for line in steps) == cell["policies"][label]["output_tokens"]
            assert all(line["interval_ms"] > 0 and line["batched_tokens"] >= line["batch_size"] for line in steps)
            if label.startswith("fixed:"):
                assert {line["gamma"] for line in steps if line["stable"]} == {int(label[-1])}
    else:
        samples = [json.loads(line) for line in (out / "traces" / "online-r1.samples.jsonl").read_text().splitlines()]
        assert samples and all("policy" not in line for line in samples)  # the engine runs one policy
        assert sum(line["committed"] for line in samples) >= online["output_tokens"]  # plus its start-up request

    assert (out / "results.md").read_text().startswith("# vspec bench results")
    assert [Path(p).name for p in document["files"]["plots"]] == ["throughput.png", "k_over_time.png"]
    assert all(Path(p).stat().st_size > 0 for p in document["files"]["plots"])


def test_k_over_time_places_decisions_within_cells(tmp_path):
    from vspec_cli.benchlib import plots

    phases = [{"cell": "a@1", "started_at": 10.0, "ended_at": 12.0}, {"cell": "b@1", "started_at": 12.5, "ended_at": 14.5}]
    trace = [{"time": 9.0, "gamma": 6}, {"time": 11.0, "gamma": 3}, {"time": 14.0, "gamma": 1}]
    xs, ys = plots._normalised_steps(trace, plots._cell_spans(phases))
    assert list(zip(xs, ys)) == [(0.0, 6), (0.5, 3), (1.0, 3), (1.0, 3), (1.75, 1), (2.0, 1)]
    if plots.available():
        series = [{"policy": "online", "repeat": 1, "phases": phases, "trace": trace}]
        assert plots.k_over_time(series, tmp_path / "k.png", "t").stat().st_size > 0
        assert plots.k_over_time([{**series[0], "trace": []}], tmp_path / "none.png", "t") is None


@pytest.mark.vllm
def test_sampled_bench_reports_quality_instead_of_equality(capsys, tiny_models, tmp_path):
    """--temperature: seeded sampled requests, the same seeds for every policy; outputs are not compared
    token for token (drafts change how randomness is used) but scored by the target's log-probabilities."""
    out = tmp_path / "bench"
    prompts = tmp_path / "tiny.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in TINY_PROMPTS))
    result = run_cli(
        capsys, "bench", "--target-model", str(tiny_models["llama-peaked"]), "--method", "ngram", "--gamma", "3",
        "--dtype", "float32", "--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "4",
        "--gpu-memory-utilization", "0.3", "--policies", "target-only,fixed:3", "--workload", str(prompts),
        "--batch", "2", "--rounds", "2", "--max-tokens", "16", "--ignore-eos", "--repeats", "1", "--enforce-eager",
        "--temperature", "0.8", "--top-p", "0.95", "--out", str(out), "--json",
    )
    assert result.exit_code == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["settings"]["temperature"] == 0.8 and document["settings"]["top_p"] == 0.95
    (cell,) = document["cells"]
    target, fixed = cell["policies"]["target-only"], cell["policies"]["fixed:3"]
    for row in (target, fixed):
        assert row["mean_logprob"] is not None and row["mean_logprob"] < 0
        assert row["matches_target_only"] is None  # sampled: no token-for-token comparison
    assert target["logprob_gap"] == 0.0 and fixed["logprob_gap_se"] is not None and fixed["logprob_gap"] == pytest.approx(
        fixed["mean_logprob"] - target["mean_logprob"])
    assert fixed["drafts"] > 0
    assert "logprob/token (vs target)" in (out / "results.md").read_text()


@pytest.mark.parametrize(("device", "visible"), [("cpu", ""), ("0,1", "0,1"), (None, None)])
def test_offline_engine_sees_the_devices_the_spec_names(device, visible):
    """Bench and profile engines get the same visible-devices variable `vspec serve` sets (they used
    to honour only "cpu", so --device 1 benchmarked whatever accelerator came first)."""
    from vspec_cli.offline_run import engine_environment
    from vspec_runtime.spec import validate_spec

    spec = validate_spec({"target_model": "t", "serving": {"device": device}})
    env = engine_environment(spec, "/tmp/run", ["fixed:1", "online"])
    assert env.get("CUDA_VISIBLE_DEVICES") == visible
    assert env["VSPEC_RUN_DIR"] == "/tmp/run" and env["VSPEC_BENCH_POLICIES"] == '["fixed:1", "online"]'
    assert validate_spec(json.loads(env["VSPEC_SPEC"])) == spec
