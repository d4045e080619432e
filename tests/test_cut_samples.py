"""benchmarks/cut_samples.py: a serve bench's step samples cut by time, on a hand-built run folder.

What a reader of its output relies on: each policy gets the steps inside its own loads only, admissions
and K switches are told from stable steps, time is charged to the decision before it, and requests are
sorted into copying answers and others through the bench's own seeded prompt draw. A bad folder gives
one line and exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vspec_cli.benchlib import load as loadlib
from vspec_cli.benchlib.serve_cli import prompt_pool
from vspec_cli.workloads import parse_workloads

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cut_samples.py"
LOAD = {"label": "2 clients", "kind": "clients", "rate": 0.0, "duration_s": 1.0, "burstiness": 1.0, "clients": 2}


def step(time, policy, gamma, interval_ms, committed, *, stable=True, batched=None, ids=("a", "b"), batch=2):
    return {"time": time, "policy": policy, "batch_size": batch, "gamma": gamma, "stable": stable,
            "interval_ms": interval_ms, "committed": committed, "drafted": batch * gamma, "accepted": 0,
            "batched_tokens": batched if batched is not None else batch * (gamma + 1), "request_ids": list(ids)}


def kinds_drawn(count):
    """The workload of each of the first ``count`` prompts the bench's closed loop sends in round 0."""
    workloads = parse_workloads("copy,chat")
    kind = {p: w.name for w in workloads for phase in w.phase_plan(1, w.size) for p in phase.prompts}
    _, prompts = prompt_pool(workloads)
    schedule = loadlib.arrivals(loadlib.LoadShape("clients", 0.0, 1.0, clients=2), prompts, seed=0)
    return [kind[arrival.prompt] for arrival in schedule[:count]]


def chat_then_copy():
    """Indexes of the first chat and the first copy prompt in round 0's draw."""
    kinds = kinds_drawn(20)
    return kinds.index("chat"), kinds.index("copy")


@pytest.fixture
def run_folder(tmp_path):
    chat, copy = chat_then_copy()
    (tmp_path / "traces").mkdir()
    (tmp_path / "requests").mkdir()
    runs = [{"policy": "fixed:3", "load": "2 clients", "repeat": 0, "round": 0, "started_at": 10.0, "ended_at": 11.0},
            {"policy": "online", "load": "2 clients", "repeat": 0, "round": 0, "started_at": 20.0, "ended_at": 21.0}]
    samples = [
        step(5.0, "warm-up:K=0", 0, 50.0, 2),  # outside every load: counted nowhere
        step(10.1, "fixed:3", 3, 100.0, 2, stable=False, batched=40),  # admits a prompt
        step(10.2, "fixed:3", 3, 50.0, 4), step(10.3, "fixed:3", 3, 50.0, 4, ids=("a",)),
        step(10.4, "fixed:3", 3, 50.0, 4, ids=("b",)),
        step(20.1, "online", 1, 40.0, 4, ids=("c", "d")), step(20.2, "online", 1, 40.0, 4, ids=("c", "d")),
        step(20.3, "online", 1, 44.0, 4, stable=False, ids=("c", "d")),  # verifies K=1 drafts, drafts at K=4
        step(20.4, "online", 4, 80.0, 8, ids=("c",)), step(20.5, "online", 4, 80.0, 8, ids=("d",)),
        step(20.6, "online", 4, 30.0, 1, ids=(), batch=1),  # the drain: one request left, no draft
    ]
    decisions = [{"time": 20.05, "policy": "online", "reason": "explore", "gamma": 1},
                 {"time": 20.25, "policy": "online", "reason": "exploit", "gamma": 4}]
    records = [{"policy": "fixed:3", "load": "2 clients", "round": 0,
                "requests": [{"index": chat, "ok": True, "done_at": 10.302},  # a: last drafted at 10.3
                             {"index": copy, "ok": True, "done_at": 10.404}]},  # b: at 10.4
               {"policy": "online", "load": "2 clients", "round": 0,
                "requests": [{"index": copy, "ok": True, "done_at": 20.403},  # c
                             {"index": chat, "ok": True, "done_at": 20.501},  # d
                             {"index": 0, "ok": True, "done_at": 29.0}]}]  # nothing drafted near it
    settings = {"workload": "copy+chat", "repeats": 1, "loads": [LOAD]}
    (tmp_path / "results.json").write_text(json.dumps({"driver": "serve", "settings": settings, "runs": runs}))
    (tmp_path / "traces" / "vspec-r1.samples.jsonl").write_text("\n".join(map(json.dumps, samples)))
    (tmp_path / "traces" / "vspec-r1.jsonl").write_text("\n".join(map(json.dumps, decisions)))
    (tmp_path / "requests" / "r1.jsonl").write_text("\n".join(map(json.dumps, records)))
    return tmp_path


def cut(folder, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), *extra], capture_output=True, text=True,
                          timeout=120)


def test_each_policy_gets_its_own_steps_split_into_admissions_switches_and_stable(run_folder):
    done = cut(run_folder, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"fixed:3 (repeat 1)", "online (repeat 1)"}
    fixed = report["fixed:3 (repeat 1)"]
    assert fixed["steps"] == 4 and fixed["seconds"] == pytest.approx(0.25)
    assert fixed["classes"]["admission"]["time_share"] == pytest.approx(0.4)
    assert fixed["classes"]["stable"]["tok_s"] == pytest.approx(80.0)
    online = report["online (repeat 1)"]
    switch = online["classes"]["switch"]
    assert switch["steps"] == 1 and switch["cost_vs_stable"] == pytest.approx(1.1)  # 11 ms a token against 10
    # time is charged to the decision made before it
    assert online["decisions"]["explore"]["steps"] == 2 and online["decisions"]["exploit"]["steps"] == 4
    assert online["decisions"]["exploit"]["time_share"] == pytest.approx(234 / 314)


def test_a_load_is_cut_into_its_steady_top_batch_and_the_rest(run_folder):
    """How much of a load ran at the batch its clients make: online's four stable batch-2 steps, its
    switch, and the drain's batch-1 step."""
    sizes = json.loads(cut(run_folder, "--json").stdout)["online (repeat 1)"]["batch_sizes"]
    assert sizes["stable at batch 2"]["steps"] == 4
    assert sizes["stable at batch 2"]["time_share"] == pytest.approx(240 / 314)
    assert sizes["other at batch 2"]["steps"] == 1 and sizes["other at batch 2"]["time_share"] == pytest.approx(44 / 314)
    assert sizes["batch below 2"]["steps"] == 1 and sizes["batch below 2"]["tok_s"] == pytest.approx(1000 / 30)
    assert "batch sizes: stable at batch 2 76.4% of time" in cut(run_folder).stdout


def test_requests_are_sorted_by_the_workload_their_prompt_was_drawn_from(run_folder):
    """fixed:3's a is a chat answer and b a copying one: of its stable steps [a, b], [a], [b], two hold a
    copying answer. online's c copies and d chats: [c, d] twice, [c], [d] (its switch step is not stable)."""
    report = json.loads(cut(run_folder, "--json").stdout)
    fixed = report["fixed:3 (repeat 1)"]["batch_mix"]
    assert fixed["with a copying answer"]["steps"] == 2 and fixed["no copying answer"]["steps"] == 1
    assert fixed["no copying answer"]["k"] == {"3": 1}
    online = report["online (repeat 1)"]["batch_mix"]
    assert online["with a copying answer"]["steps"] == 3 and online["no copying answer"]["steps"] == 1
    assert online["no copying answer"]["tok_s"] == pytest.approx(100.0)  # d's step: 8 tokens in 80 ms


def test_a_folder_that_is_not_a_timed_serve_run_gives_one_line_and_exit_1(run_folder, tmp_path):
    samples = run_folder / "traces" / "vspec-r1.samples.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    for line in lines:
        del line["time"]
    samples.write_text("\n".join(map(json.dumps, lines)))
    untimed = cut(run_folder)
    assert untimed.returncode == 1 and "carry no time" in untimed.stderr and "Traceback" not in untimed.stderr
    offline = tmp_path / "offline"
    offline.mkdir()
    (offline / "results.json").write_text(json.dumps({"driver": "offline", "runs": []}))
    not_serve = cut(offline)
    assert not_serve.returncode == 1 and "not a serve-driver run" in not_serve.stderr
