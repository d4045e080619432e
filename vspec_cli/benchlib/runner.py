"""Run the bench: one fresh engine per policy and repeat, every cell as successive phases.

A fresh engine per policy keeps controller state (and vLLM's caches) from leaking between policies.
Every engine runs the same phases in the same order; the order of the policies rotates between
repeats so slow drift of a shared machine does not always favour the same policy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from vspec_cli.offline_run import PROGRESS_MARK
from vspec_cli.benchlib.policies import BenchPolicy, policy_spec
from vspec_cli.workloads import Phase, Workload
from vspec_runtime.spec import RuntimeSpec

Event = Callable[..., None]  # on_event(kind, **fields): "engine", "stage", "engine-done"


def step_samples_path(trace: Path) -> Path:
    """Where an engine or server that writes ``trace`` records every verified step (``--step-samples``)."""
    return trace.with_name(f"{trace.stem}.samples.jsonl")


@dataclass(frozen=True)
class Cell:
    workload: Workload
    batch: int
    phases: tuple[Phase, ...]

    @property
    def key(self) -> str:
        return f"{self.workload.name}@{self.batch}"


@dataclass
class BenchPlan:
    base_spec: RuntimeSpec
    target_path: str
    drafter_path: Optional[str]
    policies: list[BenchPolicy]
    cells: list[Cell]
    repeats: int
    max_tokens: int
    ignore_eos: bool
    out_dir: Path
    engine_overrides: dict[str, Any] = field(default_factory=dict)
    mode: str = "interleaved"  # interleaved (benchlib/interleave.py) | engines (one engine per policy and repeat)
    temperature: float = 0.0  # 0: greedy (outputs compared with target-only); > 0: sampled, seeded per prompt
    top_p: Optional[float] = None
    prompts: str = "same"  # same: every round repeats the cell's prompts; new: new prompts each round
    step_samples: bool = False  # controllers also write every verified step beside their trace

    def specs(self) -> dict[str, RuntimeSpec]:
        """Each policy's spec (validated up front, so a bad policy fails before any engine starts)."""
        return {p.label: policy_spec(self.base_spec, p) for p in self.policies}

    def trace_path(self, policy: BenchPolicy, repeat: int) -> Path:
        return self.out_dir / "traces" / f"{file_label(policy.label)}-r{repeat + 1}.jsonl"

    def samples_path(self, trace: Optional[Path]) -> Optional[Path]:
        """Where the engine that writes ``trace`` records every verified step (``--step-samples``), or None."""
        if trace is None or not self.step_samples:
            return None
        return step_samples_path(trace)

    def remove_controller_files(self, trace: Path) -> None:
        """Delete an engine's trace and step samples from an earlier bench: the controller appends."""
        for path in (trace, self.samples_path(trace)):
            if path is not None:
                path.unlink(missing_ok=True)

    def phase_requests(self) -> list[dict[str, Any]]:
        requests = []
        for cell in self.cells:
            for phase in cell.phases:
                request = {"name": phase.name, "cell": cell.key, "kind": phase.kind, "batch": len(phase.prompts),
                           "prompts": list(phase.prompts), "max_tokens": self.max_tokens, "ignore_eos": self.ignore_eos}
                if self.temperature > 0:
                    # The same seeds for every policy: each prompt of the phase gets its own.
                    first_seed = 1000 * len(requests)
                    request["sampling"] = [{"temperature": self.temperature, "top_p": self.top_p, "seed": first_seed + i}
                                           for i in range(len(phase.prompts))]
                    request["logprobs"] = True
                requests.append(request)
        return requests


def build_cells(workloads: list[Workload], batches: list[int], rounds: int, same_prompts: bool = False) -> list[Cell]:
    return [Cell(w, b, tuple(w.phases(b, rounds, same_prompts))) for w in workloads for b in batches]


def file_label(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)


def rotated(policies: list[BenchPolicy], repeat: int) -> list[BenchPolicy]:
    shift = repeat % len(policies)
    return policies[shift:] + policies[:shift]


def phase_round(phase: dict[str, Any]) -> int:
    """The 0-based round of a recorded phase (older results name it only: ``...#R``, 1-based)."""
    if "round" in phase:
        return phase["round"]
    name = phase["name"]
    return int(name.rsplit("#", 1)[1]) - 1 if "#" in name else 0


@dataclass
class EngineRun:
    policy: str
    repeat: int  # 0-based
    position: int  # place in this repeat's order
    ok: bool
    wall_s: float
    log: str
    error: Optional[str] = None
    engine_ready_s: Optional[float] = None
    load_average: Optional[list[float]] = None  # 1/5/15-minute load when the engine finished: contention
    phases: list[dict[str, Any]] = field(default_factory=list)  # without outputs
    outputs: list[list[list[int]]] = field(default_factory=list)  # phase -> sequence -> token ids
    trace: Optional[list[dict[str, Any]]] = None

    def record(self) -> dict[str, Any]:
        """What results.json keeps of this run (token ids go to outputs/ instead)."""
        return {"policy": self.policy, "repeat": self.repeat + 1, "position": self.position + 1, "ok": self.ok,
                "error": self.error, "wall_s": round(self.wall_s, 3), "engine_ready_s": self.engine_ready_s,
                "load_average": self.load_average, "log": self.log, "phases": self.phases}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "EngineRun":
        """A run read back from results.json: its timings, without outputs or trace."""
        return cls(policy=record["policy"], repeat=record["repeat"] - 1, position=record["position"] - 1,
                   ok=record["ok"], wall_s=record["wall_s"], log=record["log"], error=record.get("error"),
                   engine_ready_s=record.get("engine_ready_s"), load_average=record.get("load_average"),
                   phases=record.get("phases", []))


def run_bench(plan: BenchPlan, on_event: Event) -> list[EngineRun]:
    plan.specs()
    for sub in ("logs", "traces", "outputs", "requests"):
        (plan.out_dir / sub).mkdir(parents=True, exist_ok=True)
    (plan.out_dir / "runs.jsonl").unlink(missing_ok=True)
    runs = []
    total = len(plan.policies) * plan.repeats
    for repeat in range(plan.repeats):
        for position, policy in enumerate(rotated(plan.policies, repeat)):
            on_event("engine", policy=policy.label, repeat=repeat, index=len(runs), total=total)
            trace = plan.trace_path(policy, repeat).resolve() if policy.adaptive else None
            if trace is not None:
                plan.remove_controller_files(trace)
            spec = policy_spec(plan.base_spec, policy, trace, plan.samples_path(trace))
            run = run_engine(plan, policy, spec, repeat, position, on_event)
            runs.append(run)
            with (plan.out_dir / "runs.jsonl").open("a", encoding="utf-8") as partial:
                partial.write(json.dumps(run.record()) + "\n")  # survives an interrupted bench
            on_event("engine-done", policy=policy.label, repeat=repeat, ok=run.ok, error=run.error)
    return runs


def run_engine(plan: BenchPlan, policy: BenchPolicy, spec: RuntimeSpec, repeat: int, position: int,
               on_event: Event) -> EngineRun:
    stem = f"{file_label(policy.label)}-r{repeat + 1}"
    request_file = plan.out_dir / "requests" / f"{stem}.json"
    result_file = plan.out_dir / "requests" / f"{stem}.result.json"
    log_file = plan.out_dir / "logs" / f"{stem}.log"
    result_file.unlink(missing_ok=True)
    phases = plan.phase_requests()
    request_file.write_text(json.dumps({
        "spec": json.loads(spec.to_json()), "target_path": plan.target_path,
        "drafter_path": plan.drafter_path if spec.speculating else None,
        "phases": phases, "warmup": True, "chat": True, "prefix_caching": False,
        "engine_overrides": plan.engine_overrides,
    }))
    started = time.perf_counter()
    returncode = _run_child(request_file, result_file, log_file, on_event)
    wall = time.perf_counter() - started
    run = EngineRun(policy.label, repeat, position, ok=False, wall_s=wall, log=str(log_file))
    if hasattr(os, "getloadavg"):
        run.load_average = [round(x, 2) for x in os.getloadavg()]
    if returncode != 0 or not result_file.exists():
        run.error = f"engine exited with status {returncode}: {_root_cause(log_file)}"
        return run
    result = json.loads(result_file.read_text())
    result_file.unlink()
    run.ok = True
    run.engine_ready_s = round(result.get("engine_ready_s", 0.0), 3)
    run.trace = result.get("trace")
    for asked, got in zip(phases, result["phases"]):
        run.outputs.append([out["token_ids"] for out in got["outputs"]])
        run.phases.append({
            "cell": asked["cell"], "name": asked["name"], "kind": asked["kind"], "batch": asked["batch"],
            "elapsed_s": got["elapsed_s"], "started_at": got["started_at"], "ended_at": got["ended_at"],
            "output_tokens": got["output_tokens"], "counters": got["counters"], "selections": got["selections"],
            **_mean_logprobs(got["outputs"]),
        })
    (plan.out_dir / "outputs" / f"{stem}.json").write_text(json.dumps(
        [{"name": p["name"], "token_ids": ids} for p, ids in zip(run.phases, run.outputs)]))
    return run


def _mean_logprobs(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sampled runs: each sequence's mean target log-probability per token (the quality column)."""
    means = [sum(o["logprobs"]) / len(o["logprobs"]) for o in outputs if o.get("logprobs")]
    return {"mean_logprobs": means} if means else {}


def _run_child(request_file: Path, result_file: Path, log_file: Path, on_event: Event) -> int:
    from vspec_cli.engine_child import engine_child

    with log_file.open("w", encoding="utf-8") as log, engine_child(
            ["--progress", str(request_file), str(result_file)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PROGRESS_MARK):
                on_event("stage", **json.loads(line[len(PROGRESS_MARK):]))
            else:
                log.write(line)
        return proc.wait()


_EXCEPTION_LINE = re.compile(r"\b(\w+(?:Error|Exception)): (.+)$")


def _root_cause(path: Path) -> str:
    """The first exception message in the log (the root cause; later ones are its consequences)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "no log"
    for line in text.splitlines():
        match = _EXCEPTION_LINE.search(line)
        if match and not re.search(r"root cause|stack trace", match.group(2)):
            return f"{match.group(1)}: {match.group(2).strip()}"
    return "see the log"
