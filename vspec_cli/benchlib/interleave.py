"""Interleaved bench: every policy inside warm engines that live for the whole repeat, round by round.

Why: on a shared 2-core machine a whole engine run is fast or slow (one engine-per-policy pair's
ratio moved +-11%, the machine's level 30% between hours), so ratios between policies measured in
different engines cannot resolve 2%. Here, per repeat:

- one *vspec engine* runs every scheduler policy (``fixed:K`` as a constant-K policy, ``table:``,
  ``online``, ``profile:``) through vspec's scheduler, one labelled policy object each, switched
  between rounds (vspec_runtime/control/switch.py), so policies differ only in their choice of K and
  each keeps its own learned state across its rounds, as a long-running server would;
- a *target-only engine* (no drafter) and, if asked for, one engine per ``vllm-fixed:K`` (vLLM's own
  fixed-K path, a labelled baseline) stay up beside it;
- for each cell and round, every policy runs the same prompts, in a balanced order that rotates and
  reverses from round to round (ABCD, DCBA, BCDA, ADCB, ...), so drift within a round is shared out.

Each round of each policy is one paired sample: ratios are computed per round (vspec_cli/benchlib/
paired.py), so what changes slowly (the machine, the engine run) cancels. Prefix caching is off:
the first policy in a round would otherwise pay the prefill that the others get from the cache.

Before the first round every engine is warmed (``warm_up``): the first step at a new number of
tokens costs more than the same step later (on CPU vLLM builds a oneDNN kernel per linear layer for
each new token count, about 0.8 ms a layer), and that first-visit price would otherwise land on
whichever policy first drafts at that K or first prefills that round's prompts (target-only, alone
in its engine, always), not on the policy's choice of K.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vspec_cli.benchlib.policies import BenchPolicy, policy_spec
from vspec_cli.benchlib.runner import BenchPlan, EngineRun, Event, file_label
from vspec_cli.engine_child import engine_child
from vspec_cli.offline_run import DONE_MARK, PHASE_MARK, PROGRESS_MARK
from vspec_runtime.spec import RuntimeSpec, validate_spec

TARGET_ENGINE = "target-only"
VSPEC_ENGINE = "vspec"
HOST_MEMORY_SHARE = 0.6  # of the host's memory, for all engines of a repeat together (CPU KV caches)
READY_TIMEOUT_S = 900
# vLLM's multiprocessing executor keeps its worker spinning on the shared-memory queue for 1 s after
# its last step (shm_broadcast.SpinCondition, busy_loop_s=1), so on a small machine the engine that
# just finished a phase takes a core from the next engine for that second: measured here, a batch-1
# phase right after an engine switch ran 15% slower, the noise that kept batch-1 intervals wide.
# Waiting out the spin at each switch (about two per cell and round) removes it.
SETTLE_AFTER_SWITCH_S = 1.2
# The vspec engine also holds one constant-K policy per K from 0 to its max, run only by warm_up;
# their trace lines carry these labels, so no report counts them.
WARM_UP_LABEL = "warm-up:K={}"
# Repetitive, so that an n-gram drafter finds matches from the first step and drafts its full K.
WARM_UP_PROMPT = "Repeat this list three times: red, green, blue, yellow, red, green, blue, yellow."


def balanced_order(labels: list[str], round_index: int) -> list[str]:
    """Round r: the labels rotated by r // 2, reversed on odd rounds (ABCD, DCBA, BCDA, ADCB, ...)."""
    shift = (round_index // 2) % len(labels)
    order = labels[shift:] + labels[:shift]
    return order[::-1] if round_index % 2 else order


def round_of(phase_name: str) -> int:
    """Workload phases are named ``...#R`` (1-based round)."""
    return int(phase_name.rsplit("#", 1)[1]) - 1


@dataclass
class EngineLayout:
    """Which engine each policy label runs in, and what each engine is started with."""

    engine_of: dict[str, str]  # policy label -> engine name
    requests: dict[str, dict[str, Any]]  # engine name -> offline_run request (without phases)
    traces: dict[str, Path]  # engine name -> trace file (engines with a controller)
    warm_up_gamma: dict[str, int] = field(default_factory=dict)  # engine name -> the max K its warm-up runs


def scheduler_policy_settings(base: RuntimeSpec, policy: BenchPolicy) -> dict[str, Any]:
    """What the vspec engine's controller needs for one label: its max K and adaptive settings."""
    if policy.kind == "fixed":
        adaptive = dict(base.adaptive.model_dump(), enabled=True, policy="fixed", fixed_gamma=policy.gamma,
                        min_gamma=min(base.adaptive.min_gamma, policy.gamma), trace=None, samples=None,
                        per_request=False)
        return {"gamma": policy.gamma, "adaptive": adaptive}
    spec = policy_spec(base, policy)
    return {"gamma": spec.gamma, "adaptive": dict(spec.adaptive.model_dump(), trace=None, samples=None)}


def plan_engines(plan: BenchPlan, repeat: int) -> EngineLayout:
    base = plan.base_spec
    engine_of: dict[str, str] = {}
    requests: dict[str, dict[str, Any]] = {}
    traces: dict[str, Path] = {}
    warm_up_gamma: dict[str, int] = {}
    in_vspec = [p for p in plan.policies if p.kind in ("fixed", "table", "online", "profile")]
    for policy in plan.policies:
        if policy.kind == "target-only":
            engine_of[policy.label] = TARGET_ENGINE
            requests[TARGET_ENGINE] = _request(plan, policy_spec(base, policy), drafter=False)
        elif policy.kind == "vllm-fixed":
            engine_of[policy.label] = policy.label
            requests[policy.label] = _request(plan, policy_spec(base, policy), drafter=True)
        else:
            engine_of[policy.label] = VSPEC_ENGINE
    if in_vspec:
        measured = {p.label: scheduler_policy_settings(base, p) for p in in_vspec}
        gamma = max(entry["gamma"] for entry in measured.values())
        first = next(iter(measured.values()))["adaptive"]
        # Warm-up labels first: the engine starts on K=0, so no measured policy learns from its start-up request.
        labelled = {**warm_up_policies(base, gamma), **measured}
        trace = (plan.out_dir / "traces" / f"{VSPEC_ENGINE}-r{repeat + 1}.jsonl").resolve()
        traces[VSPEC_ENGINE] = trace
        data = base.model_dump()
        samples = plan.samples_path(trace)
        data.update(gamma=gamma, adaptive=dict(first, enabled=True, trace=str(trace), min_gamma=0,
                                               samples=None if samples is None else str(samples)))
        request = _request(plan, validate_spec(data), drafter=True)
        request["bench_policies"] = labelled
        requests[VSPEC_ENGINE] = request
        warm_up_gamma[VSPEC_ENGINE] = gamma
    share = round(min(base.serving.gpu_memory_utilization or 0.3, HOST_MEMORY_SHARE / len(requests)), 3)
    for request in requests.values():
        if base.serving.device in (None, "cpu"):
            request["engine_overrides"] = {**request["engine_overrides"], "gpu_memory_utilization": share}
    return EngineLayout(engine_of, requests, traces, warm_up_gamma)


def warm_up_policies(base: RuntimeSpec, gamma: int) -> dict[str, dict[str, Any]]:
    """The vspec engine's warm-up labels: one constant-K policy for each K in 0..gamma."""
    return {WARM_UP_LABEL.format(k): scheduler_policy_settings(base, BenchPolicy(f"fixed:{k}", "fixed", gamma=k))
            for k in range(gamma + 1)}


def warm_up_phases(plan: BenchPlan, gamma: Optional[int]) -> list[tuple[dict[str, Any], Optional[str]]]:
    """What ``warm_up`` runs in one engine, as (phase, policy label); ``gamma`` None: no controller.

    Every measured phase's prompts once with two new tokens (their prefill and one decode step at
    their batch; rounds that repeat a prompt set warm it once), then, for each K, a batch as wide as
    the plan's widest that drains one request at a time (request i stops after 4 + 2i tokens), so
    that decode steps meet every batch size up to it.
    """
    measured = plan.phase_requests()
    widest = max(phase["batch"] for phase in measured)
    prefills, seen = [], set()
    for phase in measured:
        if tuple(phase["prompts"]) not in seen:
            seen.add(tuple(phase["prompts"]))
            prefills.append(dict(phase, name=f"warm-up {phase['name']}", max_tokens=2))
    drain = {"cell": "warm-up", "kind": "warm-up", "batch": widest, "prompts": [WARM_UP_PROMPT] * widest,
             "max_tokens": 4 + 2 * widest, "ignore_eos": True,
             "sampling": [{"temperature": 0.0, "max_tokens": 4 + 2 * i} for i in range(widest)]}
    if gamma is None:
        return [(phase, None) for phase in prefills] + [(dict(drain, name="warm-up drain"), None)]
    labels = [WARM_UP_LABEL.format(k) for k in range(gamma + 1)]
    return ([(phase, labels[0]) for phase in prefills]
            + [(dict(drain, name=f"warm-up drain {label}"), label) for label in labels])


def warm_up(plan: BenchPlan, layout: EngineLayout, engines: dict[str, EngineChild], on_event: Event) -> None:
    """Every engine meets the shapes of the rounds before they are timed (the module's docstring)."""
    for name, engine in engines.items():
        gamma = layout.warm_up_gamma.get(name)
        work = warm_up_phases(plan, gamma)
        time.sleep(SETTLE_AFTER_SWITCH_S)
        for index, (phase, label) in enumerate(work):
            on_event("stage", stage="phase", phase=index, phases=len(work), name=f"{phase['name']} ({name} engine)")
            engine.run(phase, label)


def _request(plan: BenchPlan, spec: RuntimeSpec, drafter: bool) -> dict[str, Any]:
    return {"spec": json.loads(spec.to_json()), "target_path": plan.target_path,
            "drafter_path": plan.drafter_path if drafter and spec.speculating else None,
            "warmup": True, "chat": True, "prefix_caching": False, "engine_overrides": dict(plan.engine_overrides)}


class EngineChild:
    """``python -m vspec_cli.offline_run --serve-phases``: one warm engine, phases sent one at a time."""

    def __init__(self, name: str, request: dict[str, Any], request_file: Path, log_file: Path) -> None:
        self.name = name
        request_file.write_text(json.dumps(request))
        self.log_file = log_file
        # Unwound by close(): the engine's whole process group is stopped first, then the log closed.
        self._resources = ExitStack()
        self.log = self._resources.enter_context(log_file.open("w", encoding="utf-8"))
        self.proc = self._resources.enter_context(engine_child(
            ["--serve-phases", str(request_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1))
        self.ready_s: Optional[float] = None

    def _next_marked(self, *marks: str) -> tuple[str, dict[str, Any]]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            for mark in marks:
                if line.startswith(mark):
                    return mark, json.loads(line[len(mark):])
            self.log.write(line)
            self.log.flush()
        raise RuntimeError(f"engine {self.name} exited with status {self.proc.wait()} (log: {self.log_file})")

    def wait_ready(self) -> None:
        while True:
            _, fields = self._next_marked(PROGRESS_MARK)
            if fields.get("stage") == "ready":
                self.ready_s = fields.get("engine_ready_s")
                return

    def run(self, phase: dict[str, Any], policy: Optional[str]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"phase": phase, "policy": policy}) + "\n")
        self.proc.stdin.flush()
        return self._next_marked(PHASE_MARK)[1]

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self._next_marked(DONE_MARK)[1]
        finally:
            self.close()

    def close(self) -> None:
        """Stop the engine and every process it started (its own session), as `vspec serve` does."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=30)  # after finish(): the engine is shutting down by itself
            except subprocess.TimeoutExpired:
                pass
        self._resources.close()


def run_interleaved(plan: BenchPlan, on_event: Event) -> list[EngineRun]:
    for sub in ("logs", "traces", "outputs", "requests"):
        (plan.out_dir / sub).mkdir(parents=True, exist_ok=True)
    (plan.out_dir / "runs.jsonl").unlink(missing_ok=True)
    runs: list[EngineRun] = []
    for repeat in range(plan.repeats):
        runs += _one_repeat(plan, repeat, on_event)
    return runs


def _one_repeat(plan: BenchPlan, repeat: int, on_event: Event) -> list[EngineRun]:
    layout = plan_engines(plan, repeat)
    for trace in layout.traces.values():
        plan.remove_controller_files(trace)
    labels = [p.label for p in plan.policies]
    started = time.perf_counter()
    records = {label: EngineRun(label, repeat, position, ok=True, wall_s=0.0,
                                log=str(plan.out_dir / "logs" / f"{file_label(layout.engine_of[label])}-r{repeat + 1}.log"))
               for position, label in enumerate(labels)}
    engines: dict[str, EngineChild] = {}
    try:
        for name, request in layout.requests.items():
            on_event("engine", policy=f"starting {name} engine", repeat=repeat, index=repeat, total=plan.repeats)
            stem = f"{file_label(name)}-r{repeat + 1}"
            engines[name] = EngineChild(name, request, plan.out_dir / "requests" / f"{stem}.json",
                                        plan.out_dir / "logs" / f"{stem}.log")
        for engine in engines.values():
            engine.wait_ready()
        warm_up(plan, layout, engines, on_event)
        phases = plan.phase_requests()
        total = len(phases) * len(labels)
        done = 0
        previous_engine = None
        for cell_phases in _by_cell_and_round(phases):
            round_index = round_of(cell_phases[0]["name"])
            for position, label in enumerate(balanced_order(labels, round_index)):
                engine = engines[layout.engine_of[label]]
                policy = label if layout.engine_of[label] == VSPEC_ENGINE else None
                if engine is not previous_engine:  # also before the first phase: warm-ups spin too
                    time.sleep(SETTLE_AFTER_SWITCH_S)
                previous_engine = engine
                for asked in cell_phases:
                    on_event("stage", stage="phase", phase=done, phases=total, name=f"{asked['name']} {label}")
                    got = engine.run(asked, policy)
                    _append_phase(records[label], asked, got, round_index, position)
                    done += 1
        on_event("stage", stage="done", phases=total)
        finished = {name: engine.finish() for name, engine in engines.items()}
    except Exception as exc:  # noqa: BLE001 - one failed repeat is reported, the others still count
        for engine in engines.values():
            engine.close()
        for record in records.values():
            record.ok, record.error = False, f"{type(exc).__name__}: {exc}"
        on_event("engine-done", policy="interleaved engines", repeat=repeat, ok=False, error=str(exc))
        return list(records.values())
    wall = time.perf_counter() - started
    for label, record in records.items():
        name = layout.engine_of[label]
        record.wall_s = wall
        record.engine_ready_s = engines[name].ready_s
        if hasattr(os, "getloadavg"):
            record.load_average = [round(x, 2) for x in os.getloadavg()]
        trace = finished[name].get("trace")
        if trace is not None and name == VSPEC_ENGINE:
            record.trace = [line for line in trace if line.get("policy") == label]
        _write_run(plan, record)
    on_event("engine-done", policy="interleaved engines", repeat=repeat, ok=True, error=None)
    return list(records.values())


def _by_cell_and_round(phases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive phases of the same cell and round (a mixed round has four)."""
    groups: list[list[dict[str, Any]]] = []
    for phase in phases:
        key = (phase["cell"], round_of(phase["name"]))
        if groups and (groups[-1][0]["cell"], round_of(groups[-1][0]["name"])) == key:
            groups[-1].append(phase)
        else:
            groups.append([phase])
    return groups


def _append_phase(record: EngineRun, asked: dict[str, Any], got: dict[str, Any], round_index: int,
                  position: int) -> None:
    record.outputs.append([out["token_ids"] for out in got["outputs"]])
    logprobs = [sum(out["logprobs"]) / len(out["logprobs"]) for out in got["outputs"] if out.get("logprobs")]
    record.phases.append({
        "cell": asked["cell"], "name": asked["name"], "kind": asked["kind"], "batch": asked["batch"],
        "round": round_index, "order_position": position,
        "elapsed_s": got["elapsed_s"], "started_at": got["started_at"], "ended_at": got["ended_at"],
        "output_tokens": got["output_tokens"], "counters": got["counters"], "selections": got["selections"],
        **({"mean_logprobs": logprobs} if logprobs else {}),
    })


def _write_run(plan: BenchPlan, record: EngineRun) -> None:
    stem = f"{file_label(record.policy)}-r{record.repeat + 1}"
    (plan.out_dir / "outputs" / f"{stem}.json").write_text(json.dumps(
        [{"name": p["name"], "token_ids": ids} for p, ids in zip(record.phases, record.outputs)]))
    with (plan.out_dir / "runs.jsonl").open("a", encoding="utf-8") as partial:
        partial.write(json.dumps(record.record()) + "\n")
