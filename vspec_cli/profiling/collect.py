"""The collect driver: one engine, K forced through a list by the sweep policy, one phase per batch.

The engine runs in a child process (``python -m vspec_cli.offline_run``, the same runner `vspec
bench` uses) with ``adaptive.policy = "sweep"`` and ``adaptive.samples`` set, so the controller
writes one JSON line per verified step. Each phase submits B prompts at once and asks for enough
tokens that every K gets ``steps_per_point`` stable steps at that batch size, whatever the
acceptance. While it runs the driver tails the samples file and reports progress through a
callback; the CLI draws it.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

# EngineRunError is raised here and stays importable from this module, where it used to live.
from vspec_cli._errors import EngineRunError, UserInputError, VspecError
from vspec_cli.profiling import companion_paths
from vspec_cli.profiling.samples import parse_sample
from vspec_runtime.spec import RuntimeSpec, SpecError, validate_spec

CHARS_PER_TOKEN = 3  # a pessimistic guess for English and code; only used to keep within max_model_len
CHAT_TEMPLATE_TOKENS = 64
POLL_S = 0.5
STOP_GRACE_S = 10  # seconds the engine gets to shut down (timeout, Ctrl-C) before SIGKILL


@dataclass(frozen=True)
class CollectSettings:
    gammas: tuple[int, ...]
    batches: tuple[int, ...]
    workload: str = "copy"
    steps_per_k: int = 8  # decode steps per K before the sweep moves on (adaptive.control_interval)
    steps_per_point: int = 20  # stable samples wanted per (batch, K)
    engine_overrides: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "gammas": list(self.gammas),
            "batches": list(self.batches),
            "workload": self.workload,
            "steps_per_k": self.steps_per_k,
            "steps_per_point": self.steps_per_point,
            "engine_overrides": dict(self.engine_overrides),
        }


@dataclass
class CollectPlan:
    spec: RuntimeSpec  # the sweep spec the engine runs
    settings: CollectSettings
    target_path: str
    drafter_path: Optional[str]
    phases: list[dict[str, Any]]
    profile_path: Path
    samples_path: Path
    manifest_path: Path
    log_path: Path
    notes: list[str] = field(default_factory=list)

    def request(self) -> dict[str, Any]:
        """The offline_run request: warm-up, then the phases in order."""
        return {
            "spec": json.loads(self.spec.to_json()),
            "target_path": self.target_path,
            "drafter_path": self.drafter_path,
            "phases": self.phases,
            "warmup": True,
            "chat": True,
            "prefix_caching": False,  # every phase pays its prefill, as the fitted model assumes
            "engine_overrides": dict(self.settings.engine_overrides),
        }

    def describe(self) -> dict[str, Any]:
        """What a run would do (the dry run prints this)."""
        return {
            "settings": self.settings.as_dict(),
            "spec": json.loads(self.spec.to_json()),
            "models": {"target": self.target_path, "drafter": self.drafter_path},
            "phases": [phase_record(p) for p in self.phases],
            "files": {"profile": str(self.profile_path), "samples": str(self.samples_path),
                      "manifest": str(self.manifest_path), "log": str(self.log_path)},
            "notes": list(self.notes),
        }


def phase_record(phase: dict[str, Any], result: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    record = {"name": phase["name"], "batch_size": len(phase["prompts"]), "max_tokens": phase["max_tokens"]}
    if result is not None:
        record["elapsed_s"] = round(result["elapsed_s"], 3)
        record["output_tokens"] = result["output_tokens"]
    return record


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """'0,1,2' or '0-6' or '0-2,4' -> sorted distinct integers."""
    values: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            if "-" in part[1:]:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low:
                    raise ValueError
                values.update(range(low, high + 1))
            else:
                values.add(int(part))
    except ValueError:
        raise UserInputError(f"{option}: expected integers like 0,1,2 or a range 0-6, got '{text}'") from None
    if not values:
        raise UserInputError(f"{option}: give at least one value")
    return tuple(sorted(values))


def batch_prompts(workload: str, batch: int) -> list[str]:
    """``batch`` prompts of a `vspec bench` workload (vspec_cli/workloads.py), so a profile and a bench
    run see the same text. A workload of several phases (mixed) is interleaved phase by phase."""
    from vspec_cli.workloads import load_workload

    phases = [list(phase.prompts) for phase in load_workload(workload).phases(batch, 1)]
    interleaved = [phase[i] for i in range(max(len(p) for p in phases)) for phase in phases if i < len(phase)]
    return interleaved[:batch]


def sweep_spec(base: RuntimeSpec, settings: CollectSettings, samples_path: Path) -> RuntimeSpec:
    """``base`` with the controller switched to the sweep policy writing ``samples_path``."""
    if not base.speculating:
        raise UserInputError("profiling needs a drafting method (--method ngram, draft, eagle or eagle3), not 'none'")
    too_big = [k for k in settings.gammas if k > base.gamma]
    if too_big:
        raise UserInputError(
            f"--gammas: K={too_big[-1]} is above the server's maximum K (gamma = {base.gamma})",
            hint=f"measure the serving setup you will run: add --gamma {too_big[-1]}, or drop the larger K values",
        )
    data = json.loads(base.to_json())
    data["adaptive"].update({
        "enabled": True,
        "policy": "sweep",
        "profile": None,
        "fixed_gamma": None,
        "sweep_gammas": list(settings.gammas),
        "control_interval": settings.steps_per_k,
        "samples": str(samples_path.resolve()),
        "trace": None,
    })
    try:
        return validate_spec(data, "profile collect")
    except SpecError as exc:
        raise UserInputError(str(exc)) from None


def phase_max_tokens(settings: CollectSettings) -> int:
    """Tokens per request so that every K gets ``steps_per_point`` stable steps even at full acceptance.

    A block of ``steps_per_k`` steps at K yields steps_per_k - 1 stable ones (the first verifies the
    previous K's drafts) and at most steps_per_k * (K+1) tokens per request.
    """
    cycles = math.ceil(settings.steps_per_point / (settings.steps_per_k - 1))
    return cycles * settings.steps_per_k * sum(k + 1 for k in settings.gammas)


def plan_collect(
    base: RuntimeSpec,
    settings: CollectSettings,
    profile_path: Path,
    target_path: str,
    drafter_path: Optional[str],
) -> CollectPlan:
    if settings.steps_per_k < 2:
        raise UserInputError(
            f"--steps-per-k: got {settings.steps_per_k}; must be >= 2 (the first step after a switch is not stable)")
    if settings.steps_per_point < 1:
        raise UserInputError(f"--steps-per-point: got {settings.steps_per_point}; must be >= 1")
    if any(b < 1 for b in settings.batches):
        raise UserInputError(f"--batches: batch sizes must be >= 1, got {list(settings.batches)}")
    if not profile_path.name.endswith(".json"):
        raise UserInputError(f"--output: got '{profile_path}'; the profile is a .json file")
    samples_path, manifest_path = companion_paths(profile_path)
    spec = sweep_spec(base, settings, samples_path)
    serving = spec.serving
    notes: list[str] = []
    if serving.max_num_seqs is not None and max(settings.batches) > serving.max_num_seqs:
        raise UserInputError(
            f"--batches: {max(settings.batches)} requests at once exceed max_num_seqs ({serving.max_num_seqs})",
            hint=f"add --max-num-seqs {max(settings.batches)}, or measure smaller batches",
        )
    if serving.max_num_batched_tokens is not None:
        for batch in settings.batches:
            capped = [k for k in settings.gammas if batch * (k + 1) > serving.max_num_batched_tokens]
            if capped:
                notes.append(f"batch {batch}: K >= {capped[0]} does not fit max_num_batched_tokens "
                             f"({serving.max_num_batched_tokens}); those steps run at the largest K that fits")
    prompts = {batch: batch_prompts(settings.workload, batch) for batch in settings.batches}
    max_tokens = phase_max_tokens(settings)
    if serving.max_model_len is not None:
        longest = max(len(p) for batch_list in prompts.values() for p in batch_list)
        budget = serving.max_model_len - longest // CHARS_PER_TOKEN - CHAT_TEMPLATE_TOKENS
        if budget < 16:
            raise UserInputError(f"max_model_len {serving.max_model_len} leaves no room to generate after the prompts",
                                 hint="raise --max-model-len")
        if budget < max_tokens:
            notes.append(f"phases capped at {budget} tokens per request by max_model_len ({serving.max_model_len}); "
                         f"fewer than {settings.steps_per_point} stable steps per point are possible")
            max_tokens = budget
    phases = [
        {"name": f"batch{batch}", "prompts": prompts[batch], "max_tokens": max_tokens, "ignore_eos": True}
        for batch in settings.batches
    ]
    return CollectPlan(
        spec=spec, settings=settings, target_path=target_path, drafter_path=drafter_path, phases=phases,
        profile_path=profile_path, samples_path=samples_path, manifest_path=manifest_path,
        log_path=profile_path.with_name(profile_path.name.removesuffix(".json") + ".collect.log"), notes=notes,
    )


# --- running it ---------------------------------------------------------------------------------


@dataclass
class CollectProgress:
    """What the samples file told us so far."""

    elapsed_s: float = 0.0
    lines: int = 0
    stable: Counter = field(default_factory=Counter)  # (batch, K) -> stable samples
    last_batch: Optional[int] = None
    last_gamma: Optional[int] = None

    def covered(self, settings: CollectSettings) -> int:
        """Stable samples counted towards the plan: at most steps_per_point per requested (batch, K)."""
        return sum(min(self.stable[(b, k)], settings.steps_per_point) for b in settings.batches for k in settings.gammas)


class _SampleTail:
    """Reads the lines appended to the samples file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete if line.strip()]


def _update(progress: CollectProgress, lines: list[str], where: str) -> None:
    for raw in lines:
        progress.lines += 1
        try:
            sample = parse_sample(json.loads(raw), where, progress.lines)
        except (ValueError, VspecError):
            continue  # the fit reads the file again and reports bad lines properly
        progress.last_batch, progress.last_gamma = sample.batch_size, sample.gamma
        if sample.stable:
            progress.stable[(sample.batch_size, sample.gamma)] += 1


def last_error_line(log_text: str) -> str:
    for line in reversed(log_text.splitlines()):
        stripped = line.strip()
        if stripped and ("Error" in stripped or "error" in stripped or "Exception" in stripped):
            return stripped[-300:]
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "no output"


def run_collect(plan: CollectPlan, on_progress: Optional[Callable[[CollectProgress], None]] = None,
                timeout_s: Optional[float] = None) -> dict[str, Any]:
    """Run the engine; returns offline_run's result plus ``elapsed_s``. Samples land in plan.samples_path."""
    from vspec_cli.engine_child import engine_child

    plan.profile_path.parent.mkdir(parents=True, exist_ok=True)
    plan.samples_path.unlink(missing_ok=True)  # the controller appends: start from an empty file
    work = Path(tempfile.mkdtemp(prefix="vspec-collect-"))
    request_file, result_file = work / "request.json", work / "result.json"
    request_file.write_text(json.dumps(plan.request()), encoding="utf-8")
    progress = CollectProgress()
    tail = _SampleTail(plan.samples_path)
    started = time.monotonic()
    # Leaving engine_child takes the engine and its workers down (Ctrl-C, the timeout below) and
    # sweeps workers that outlived a finished runner.
    with open(plan.log_path, "w", encoding="utf-8") as log, engine_child(
            [str(request_file), str(result_file)], grace=STOP_GRACE_S, stdout=log, stderr=subprocess.STDOUT) as child:
        while True:
            try:
                status = child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            progress.elapsed_s = time.monotonic() - started
            _update(progress, tail.new_lines(), str(plan.samples_path))
            if on_progress is not None:
                on_progress(progress)
            if timeout_s is not None and progress.elapsed_s > timeout_s:
                raise EngineRunError(f"the collect run took longer than {timeout_s:.0f} s and was stopped",
                                     hint=f"see the engine log: {plan.log_path}")
    progress.elapsed_s = time.monotonic() - started
    _update(progress, tail.new_lines(), str(plan.samples_path))
    if on_progress is not None:
        on_progress(progress)
    if status != 0 or not result_file.exists():
        reason = last_error_line(plan.log_path.read_text(encoding="utf-8", errors="replace"))
        raise EngineRunError(f"the engine run failed (exit {status}): {reason}", hint=f"full log: {plan.log_path}")
    result = json.loads(result_file.read_text(encoding="utf-8"))
    result["elapsed_s"] = progress.elapsed_s
    return result
