"""`vspec bench --driver serve`: arrival schedules, latency metrics, the paired report, and one real run.

The real run (marked vllm) starts the two servers the driver uses on a tiny model and checks what a
reader of results.json relies on: every request answered, each policy's loads at its own K, greedy
answers equal to target-only's, ratios and checks present. No timing thresholds.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from cli_helpers import run_cli
from vspec_cli.benchlib import load as loadlib
from vspec_cli.benchlib import serve_cli, serve_report
from vspec_cli.benchlib.policies import parse_policies
from vspec_cli.benchlib.serve_driver import LoadRun

PROMPTS = [f"prompt {i}" for i in range(10)]


# --- arrivals --------------------------------------------------------------------------------------

def test_a_seed_gives_every_policy_the_same_arrivals_and_prompts():
    shape = loadlib.LoadShape("rate", 2.0, 30.0)
    first, again = loadlib.arrivals(shape, PROMPTS, seed=7), loadlib.arrivals(shape, PROMPTS, seed=7)
    assert first == again
    assert loadlib.arrivals(shape, PROMPTS, seed=8) != first


def test_poisson_arrivals_come_at_the_asked_rate():
    schedule = loadlib.arrivals(loadlib.LoadShape("rate", 2.0, 500.0), PROMPTS, seed=1)
    assert 900 <= len(schedule) <= 1100  # 1000 expected; 5 standard deviations is about +-160
    assert all(b.at_s >= a.at_s for a, b in zip(schedule, schedule[1:])) and schedule[0].at_s == 0


def test_lower_burstiness_means_burstier_arrivals():
    def gap_cv(burstiness: float) -> float:
        times = [a.at_s for a in loadlib.arrivals(loadlib.LoadShape("rate", 2.0, 500.0, burstiness), PROMPTS, 3)]
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.stdev(gaps) / statistics.fmean(gaps)

    assert gap_cv(0.25) > 1.5 > gap_cv(1.0) > 0.8 > gap_cv(8.0)


def test_a_ramp_rises_to_its_peak_at_half_time_and_falls_back():
    shape = loadlib.LoadShape("ramp", 4.0, 300.0)
    assert shape.rate_at(0) == pytest.approx(0.4) and shape.rate_at(150) == pytest.approx(4.0)
    assert shape.rate_at(300) == pytest.approx(0.4)
    times = [a.at_s for a in loadlib.arrivals(shape, PROMPTS, seed=2)]
    thirds = [sum(lo <= t < lo + 100 for t in times) for lo in (0, 100, 200)]
    assert thirds[1] > 1.5 * thirds[0] and thirds[1] > 1.5 * thirds[2]


def test_a_closed_loop_gives_every_policy_the_same_prompts_in_the_same_order():
    shape = loadlib.LoadShape("clients", 0.0, 2.0, clients=3)
    schedule = loadlib.arrivals(shape, PROMPTS, seed=5)
    assert schedule == loadlib.arrivals(shape, PROMPTS, seed=5) != loadlib.arrivals(shape, PROMPTS, seed=6)
    assert shape.label == "3 clients" and [a.index for a in schedule] == list(range(len(schedule)))
    # Written out in advance, so it must outlast any server: more requests than clients could finish.
    assert len(schedule) >= 3 * 2.0 * 10 and {a.at_s for a in schedule} == {0.0}


@pytest.mark.parametrize(("rates", "concurrency", "labels"), [
    (None, None, ["0.25 req/s", "0.5 req/s", "1 req/s", "2 req/s", "4 req/s"]),
    (None, "8", ["8 clients"]),  # closed loops only: the default rates are not added
    ("2", "4,8", ["2 req/s", "4 clients", "8 clients"]),
])
def test_serve_loads_are_rates_then_closed_loops_then_the_ramp(rates, concurrency, labels):
    loads = serve_cli.load_shapes(rates, concurrency, 12.0, 3.0, 24.0, 1.0)
    assert [load.label for load in loads] == labels + ["ramp to 3 req/s"]
    assert all(load.duration_s == 12.0 for load in loads[:-1])


def test_a_short_load_still_sends_a_few_requests():
    assert len(loadlib.arrivals(loadlib.LoadShape("rate", 0.01, 1.0), PROMPTS, seed=0)) == loadlib.MIN_REQUESTS


# --- metrics ---------------------------------------------------------------------------------------

def record(index, sent, first, done, tokens, gaps=(), ok=True):
    r = loadlib.RequestRecord(index, sent_at=sent, ok=ok, first_at=first, done_at=done, output_tokens=tokens)
    r.chunk_gaps = list(gaps)
    return r


def test_load_metrics_follow_vllm_bench_serve_definitions():
    records = [record(0, 0.0, 0.1, 1.1, 11, gaps=[0.1] * 10), record(1, 0.5, 0.8, 2.0, 5, gaps=[0.3] * 4),
               record(2, 1.0, None, None, 0, ok=False)]
    m = loadlib.load_metrics(records)
    assert (m["requests"], m["completed"], m["failed"]) == (3, 2, 1)
    assert m["makespan_s"] == pytest.approx(2.0) and m["output_tok_s"] == pytest.approx(16 / 2.0)
    assert m["ttft_p50"] == pytest.approx(0.2)  # (0.1 + 0.3) / 2
    assert m["tpot_p50"] == pytest.approx((0.1 + 0.3) / 2)  # (1.1-0.1)/10 and (2.0-0.8)/4
    assert m["itl_p99"] == pytest.approx(0.3)


def test_a_closed_loop_counts_the_tokens_streamed_while_its_clients_were_sending():
    # Two requests sent at 0 s and 1 s of a 2 s closed loop; the second streams half of its tokens after 2 s.
    first, second = record(0, 0.0, 0.1, 1.0, 10), record(1, 1.0, 1.1, 3.0, 8)
    first.progress = [(0.1, 1), (0.5, 6), (1.0, 10)]
    second.progress = [(1.1, 1), (1.9, 4), (2.5, 6), (3.0, 8)]
    m = loadlib.load_metrics([first, second], window_s=2.0)
    assert m["output_tok_s"] == pytest.approx((10 + 4) / 2.0)
    assert m["makespan_tok_s"] == pytest.approx(18 / 3.0) and m["window_s"] == 2.0
    assert "progress" not in first.record()  # a line per chunk stays out of requests/*.jsonl


def test_percentiles_interpolate_like_numpy():
    assert loadlib.percentile([1, 2, 3, 4], 50) == 2.5 and loadlib.percentile([5], 99) == 5
    assert loadlib.percentile([], 50) is None


# --- the report --------------------------------------------------------------------------------------

def load_run(policy, round_index, tok_s, tpot, texts=("a", "b"), counters=None, tpots=()):
    return LoadRun(policy, "1 req/s", 0, 0, round_index, 0, 0.0, 1.0,
                   {"output_tok_s": tok_s, "tpot_p50": tpot, "failed": 0}, counters or {}, list(texts), list(tpots))


def test_report_pairs_rounds_against_the_best_baseline_and_judges_online():
    policies = parse_policies("target-only,fixed:3,online")
    runs = []
    for r, noise in enumerate((1.0, 1.1, 0.9, 1.05)):
        runs += [load_run("target-only", r, 100 * noise, 0.030 * noise),
                 load_run("fixed:3", r, 120 * noise, 0.025 * noise,
                          counters={"vllm:spec_decode_num_drafts_total": 10, "vllm:spec_decode_num_accepted_tokens_total": 15,
                                    "k3": 40}),
                 load_run("online", r, 60 * noise, 0.050 * noise, texts=("a", "c"), counters={"k0": 5, "k3": 15})]
    (cell,) = serve_report.summarise(policies, ["1 req/s"], runs, greedy=True)
    assert cell["best_baseline"] == "fixed:3" and cell["best_tpot_baseline"] == "fixed:3"
    online = cell["policies"]["online"]
    assert online["paired_best"]["ratio"] == pytest.approx(0.5) and online["paired_best"]["pairs"] == 4
    assert online["paired_target_only"]["ratio"] == pytest.approx(0.6)
    assert online["paired_tpot_vs_best"]["ratio"] == pytest.approx(0.5)
    assert online["same_as_target_only"] == {"compared": 8, "equal": 4}
    assert online["k_histogram"] == {"0": 20, "3": 60}
    assert cell["policies"]["fixed:3"]["acceptance_length"] == pytest.approx(2.5)
    verdicts = [c["verdict"] for c in serve_report.checks([cell])]
    assert verdicts == ["missed", "missed", "not measured"]  # no per-request TPOTs recorded
    markdown_rows = serve_report.table_rows([cell])
    assert [row[1] for row in markdown_rows] == ["target-only", "fixed:3", "online"]


def test_per_request_tpot_pairs_each_request_with_its_twin_and_resolves_what_the_p50s_cannot():
    """A round's requests are a copy answer (fast tokens) and a chat answer (slow ones). Online is 1%
    slower than fixed:3 on every request, but whether its median lands on a copy or a chat answer flips
    between rounds: the ratio of p50s swings and straddles the 3% tolerance, the per-request pairing
    sees the 1% and resolves it."""
    policies = parse_policies("target-only,fixed:3,online")
    runs = []
    for r, (noise, online_p50) in enumerate(((1.0, 0.011), (1.1, 0.030), (0.95, 0.011), (1.05, 0.030))):
        copy, chat = 0.010 * noise, 0.030 * noise
        runs += [load_run("target-only", r, 100, 0.040, tpots=[2 * copy, 2 * chat]),
                 load_run("fixed:3", r, 120, 0.020 * noise, tpots=[copy, chat, None]),
                 load_run("online", r, 120, online_p50, tpots=[1.01 * copy, 1.01 * chat, 0.5])]
    (cell,) = serve_report.summarise(policies, ["1 req/s"], runs, greedy=False)
    online = cell["policies"]["online"]
    per_request = online["per_request_tpot_vs_best"]
    assert per_request["ratio"] == pytest.approx(1 / 1.01) and per_request["pairs"] == 4
    assert per_request["low"] > 1 / 1.03  # request 3 (fixed:3 failed it) is left out
    checks = {c["check"]: c["verdict"] for c in serve_report.checks([cell])}
    assert checks["online TPOT p50 within 3% of the best"] == "not resolved"
    assert checks["online TPOT within 3% of the best, request by request"] == "met"
    assert cell["policies"]["fixed:3"].get("per_request_tpot_vs_best") is None  # the reference itself


def test_pool_runs_pools_serve_runs_per_load_with_every_round_in_one_sample(tmp_path):
    """Two serve runs of one load, 10% apart in level, each with four rounds up to 10% apart: online is
    2% behind fixed:3 in tok/s and TPOT in every round (+-0.4%). benchmarks/pool_runs.py gives one line
    per load and policy over both runs' eight rounds, with an interval the levels do not widen; it
    refuses to pool a serve run with an offline one, and a file that is not a bench's results."""
    import subprocess
    import sys

    policies = parse_policies("target-only,fixed:3,online")
    folders = []
    for name, level in (("run-a", 1.0), ("run-b", 0.9)):
        runs = []
        for r, noise in enumerate((1.0, 1.05, 0.95, 1.02)):
            wobble = 1.0 + 0.004 * (-1) ** r  # what each round's pair adds to the 2%
            tok = 120 * level * noise
            runs += [load_run("target-only", r, 100 * level * noise, 0.030 / noise),
                     load_run("fixed:3", r, tok, 0.020 / noise),
                     load_run("online", r, tok * 0.98 * wobble, 0.020 / noise / (0.98 * wobble))]
        cells = serve_report.summarise(policies, ["1 req/s"], runs, greedy=False)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(
            {"driver": "serve", "cells": cells, "runs": [run.record() for run in runs]}))
        folders.append(str(folder))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "pool_runs.py"
    done = subprocess.run([sys.executable, str(script), *folders], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (online,) = [line for line in done.stdout.splitlines() if line.startswith("1 req/s, online:")]
    assert "x best baseline 0.980x [" in online and "(8 pairs, 2 runs)" in online
    assert "x target-only 1.176x [" in online and "best TPOT / TPOT 0.980x [" in online
    pooled = serve_report.pooled_over_runs([json.loads((Path(f) / "results.json").read_text()) for f in folders])
    (entry,) = [e for e in pooled["1 req/s"] if (e["policy"], e["reference"]) == ("online", "best_baseline")]
    assert 0.97 < entry["low"] < 0.98 < entry["high"] < 0.99  # the wobble, not the runs' levels, sets the width

    offline = tmp_path / "offline"
    offline.mkdir()
    (offline / "results.json").write_text(json.dumps({"driver": "offline", "cells": [], "runs": []}))
    mixed = subprocess.run([sys.executable, str(script), folders[0], str(offline)], capture_output=True,
                           text=True, timeout=60)
    assert mixed.returncode == 1 and "mix the serve driver with the offline one" in mixed.stderr
    (offline / "results.json").write_text("{not json")
    broken = subprocess.run([sys.executable, str(script), str(offline)], capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1 and "is not one vspec bench wrote" in broken.stderr
    assert "Traceback" not in broken.stderr


# --- warm-up ---------------------------------------------------------------------------------------

def test_every_server_is_warmed_on_the_pool_and_every_k_down_to_batch_one(tmp_path):
    """A first visit to a prompt or a decode shape costs more than later ones (on CPU a new kernel per
    layer): whoever paid it inside a timed load would look slower for it, so each server meets the
    pool's prompts and, at every K, every batch size up to its widest before the first load; the vspec
    server does so under labels no report counts."""
    from vspec_cli.benchlib.serve_driver import ServePlan, vspec_server_spec, warm_up_loads
    from vspec_runtime.spec import validate_spec

    base = validate_spec({"target_model": "demo", "method": "ngram", "gamma": 3})
    plan = ServePlan(base, "/target", None, parse_policies("target-only,fixed:1,online"), PROMPTS, loads=[],
                     rounds=1, repeats=1, sampling=loadlib.Sampling(max_tokens=48), out_dir=tmp_path)
    spec, labelled = vspec_server_spec(plan, tmp_path / "trace.jsonl")
    assert spec.gamma == 3
    assert list(labelled) == [f"warm-up:K={k}" for k in range(4)] + ["fixed:1", "online"]  # starts on K=0's
    sampled = loadlib.Sampling(max_tokens=48, temperature=0.8, seed=7)
    for gamma, expected_labels in ((None, [None]), (3, [f"warm-up:K={k}" for k in range(4)])):
        loads = warm_up_loads(PROMPTS, sampled, width=8, gamma=gamma)
        prefills = [load for load in loads if load.sampling.max_tokens == 2]
        assert sorted(a.prompt for load in prefills for a in load.schedule) == sorted(PROMPTS)  # each once
        assert {load.label for load in prefills} == {expected_labels[0]}
        drains = loads[len(prefills):]
        assert [load.label for load in drains] == expected_labels
        for load in drains:  # eight requests sent at once that stop one after another: batches 8, 7, ..., 1
            lengths = [arrival.max_tokens for arrival in load.schedule]
            assert len(set(lengths)) == 8 and all(a.at_s == 0.0 for a in load.schedule)
            assert load.sampling.ignore_eos and load.sampling.temperature == 0.8  # the bench's own sampling
            bodies = [loadlib.request_body("bench", a.prompt, load.sampling, None, a.max_tokens)
                      for a in load.schedule]
            assert [body["max_tokens"] for body in bodies] == lengths


# --- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--rates", "1,x"], "--rates"),
    (["--rates", "0"], "> 0"),
    (["--rates", ""], "--rates"),
    (["--concurrency", "8,x"], "--concurrency"),
    (["--concurrency", "0"], "> 0"),
    (["--policies", "target-only,vllm-fixed:3"], "vllm-fixed:3"),
    (["--workload", "chat,nonsense"], "unknown workload"),
    (["--driver", "live"], "--driver"),
])
def test_bad_serve_driver_input_exits_2_with_one_line(capsys, args, message):
    result = run_cli(capsys, "bench", "--preset", "demo", "--driver", "serve", *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


# --- one real serve bench ----------------------------------------------------------------------------

TINY_PROMPTS = ["one two three one two three one two three one two",
                "The quick brown fox jumps over the lazy dog. The quick brown fox"]


@pytest.mark.vllm
def test_serve_bench_on_tiny_models(capsys, tiny_models, tmp_path):
    out = tmp_path / "serve-bench"
    prompts = tmp_path / "tiny.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in TINY_PROMPTS))
    policies = "target-only,fixed:1,online"
    result = run_cli(
        capsys, "bench", "--driver", "serve", "--target-model", str(tiny_models["llama"]), "--method", "ngram",
        "--gamma", "3", "--dtype", "float32", "--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "8",
        "--adaptive-control-interval", "1", "--adaptive-min-gamma", "1", "--policies", policies,
        "--workload", str(prompts), "--rates", "4", "--concurrency", "2", "--duration", "1.5", "--ramp", "6", "--ramp-duration", "2",
        "--rounds", "2", "--repeats", "1", "--max-tokens", "16", "--ignore-eos", "--enforce-eager",
        "--step-samples", "--out", str(out), "--json",
    )
    assert result.exit_code == 0, result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document["driver"] == "serve" and document["settings"]["prefix_caching"] is True
    assert all(server["ok"] for server in document["servers"])
    assert [c["load"] for c in document["cells"]] == ["4 req/s", "2 clients", "ramp to 6 req/s"]
    for cell in document["cells"]:
        rows = cell["policies"]
        assert list(rows) == policies.split(",")
        for label, row in rows.items():
            assert row["rounds"] == 2 and row["failed"] == 0 and row["output_tok_s"] > 0
            assert row["tpot_p50"] > 0 and row["ttft_p99"] >= row["ttft_p50"]
            if label != "target-only":
                same = row["same_as_target_only"]
                assert same["compared"] > 0 and same["equal"] == same["compared"], (label, same)
                assert row["paired_target_only"]["pairs"] == 2
        # Constant-K policies ran at their own K inside the one vspec server: the switch happened.
        assert set(rows["fixed:1"]["k_histogram"]) == {"1"}
        assert rows["online"]["k_histogram"] and all(1 <= int(k) <= 3 for k in rows["online"]["k_histogram"])
        assert set(rows["online"]["k_histogram"]) != {"1"}, "online ran at fixed:1's K: no switch between loads"
        assert rows["fixed:1"]["acceptance_length"] > 1.0
    assert {c["verdict"] for c in document["checks"]} <= {"met", "missed", "not resolved"}
    assert len(document["checks"]) == 9  # per load: tok/s, TPOT p50, TPOT request by request
    for cell in document["cells"]:  # every request answered by both: each round pairs them
        assert cell["policies"]["online"]["per_request_tpot_vs_best"]["pairs"] == 2
    raw = [json.loads(line) for line in (out / "requests" / "r1.jsonl").read_text().splitlines()]
    assert len(raw) == 3 * 2 * 3  # loads x rounds x policies
    for run in (r for r in raw if r["load"] == "2 clients"):
        # Closed loop: once both clients have started (the second a quarter of the load's 1.5 s after
        # the first), two requests in flight from then to the last send, each client's next one sent
        # only once its answer was complete, none sent after the load's 1.5 s.
        requests = sorted(run["requests"], key=lambda r: r["sent_at"])
        assert len(requests) > 2 and all(r["ok"] for r in requests)
        assert requests[-1]["sent_at"] - requests[0]["sent_at"] < 1.5
        in_flight = {r["index"]: len([o for o in requests if o["sent_at"] < r["sent_at"] < o["done_at"]])
                     for r in requests}
        both_started = [r["index"] for r in requests if r["sent_at"] > requests[0]["sent_at"] + 1.5 / 4 + 0.05]
        assert both_started and all(in_flight[i] == 1 for i in both_started), (run["policy"], in_flight)
        assert max(in_flight.values()) == 1, (run["policy"], in_flight)
        # Its tok/s counts what streamed within those 1.5 s: at least the answers complete by then, not
        # the ones that drained after.
        metrics = next(r["metrics"] for r in document["runs"]
                       if (r["load"], r["policy"], r["round"]) == ("2 clients", run["policy"], run["round"]))
        window_end = requests[0]["sent_at"] + 1.5
        complete_by_then = sum(r["output_tokens"] for r in requests if r["done_at"] <= window_end)
        all_tokens = sum(r["output_tokens"] for r in requests)
        assert complete_by_then <= metrics["output_tok_s"] * 1.5 < all_tokens, (run["policy"], metrics)
    assert (out / "results.md").read_text().startswith("# vspec bench (serve driver)")
    assert sorted(Path(p).name for p in document["files"]["plots"]) == ["ramp_k.png", "rates.png"]
    # The vspec server was warmed at every K before the first load, batches draining to one request,
    # under warm-up labels that no row of the report counts.
    trace = [json.loads(line) for line in (out / "traces" / "vspec-r1.jsonl").read_text().splitlines()]
    warm = [line for line in trace if line["policy"].startswith("warm-up:")]
    first_timed = min(line["time"] for line in trace if not line["policy"].startswith("warm-up:"))
    assert warm and max(line["time"] for line in warm) < first_timed
    assert {(line["policy"], line["gamma"]) for line in warm} >= {(f"warm-up:K={k}", k) for k in range(4)}
    assert 1 in {line["batch_size"] for line in warm if line["policy"] == "warm-up:K=3"}
    # --step-samples: every verified step of the vspec server under its label; a label's steps commit
    # exactly the tokens its loads streamed, and fixed:1's stable steps ran at K=1.
    samples = [json.loads(line) for line in (out / "traces" / "vspec-r1.samples.jsonl").read_text().splitlines()]
    for label in ("fixed:1", "online"):
        steps = [line for line in samples if line.get("policy") == label]
        streamed = sum(run["metrics"]["output_tokens"] for run in document["runs"] if run["policy"] == label)
        assert steps and sum(line["committed"] for line in steps) == streamed, label
    assert {line["gamma"] for line in samples if line.get("policy") == "fixed:1" and line["stable"]} == {1}
    # A step's time is on the clock the loads are timed with: each measured step falls inside one of
    # its own label's loads, so a run's steps are cut out of the file by its start and end.
    for line in samples:
        if not line["policy"].startswith("warm-up:"):
            loads = [(run["started_at"], run["ended_at"]) for run in document["runs"] if run["policy"] == line["policy"]]
            assert any(start <= line["time"] <= end for start, end in loads), line
