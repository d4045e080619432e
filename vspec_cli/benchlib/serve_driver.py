"""`vspec bench --driver serve`: policies under live load through the real server, interleaved.

Per repeat, two servers run side by side, each started with the exact command `vspec serve` builds
(vspec_cli/launch.py; prefix caching on, as users run it):

- a *vspec server* that runs every scheduler policy (``fixed:K`` as a constant-K policy, ``table:``,
  ``online``, ``profile:``), one labelled policy object each, switched between loads through the
  same file the offline interleaved bench uses (the controller reads it when the engine goes idle,
  vspec_runtime/controller.py), so each policy keeps its learned state across its loads;
- a *target-only server* (no drafter).

Each load (a constant request rate, the ramp, or a closed loop of clients) runs ``rounds`` times; in
every round each policy gets the same arrival times (or order) and prompts (one seed per load and
round), in the balanced order of the offline bench (ABCD, DCBA, ...). A round of a policy is one paired
sample, as in the offline bench (vspec_cli/benchlib/paired.py). Before the first load every server is
warmed (``warm_up_loads``): it answers each prompt of the pool once, so the prefix cache holds them for
every policy alike and the first policy of a round pays no prefill the others skip, and then, at every K
the vspec server can run, a batch that drains one request at a time, so that no measured policy pays the
first visit of a decode shape (vLLM builds a oneDNN kernel per linear layer for each new token count on
CPU; vspec_cli/benchlib/interleave.py). The vspec server starts on, and warms under, labels that no
report counts (``warm-up:K=k``). Between loads the driver waits out vLLM's 1 s worker spin (see
interleave.SETTLE_AFTER_SWITCH_S). Acceptance and the K histogram of a load come from the vspec server's
/metrics, read before and after it (the snapshot is published when the engine goes idle).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from vspec_cli.benchlib import load as loadlib
from vspec_cli.benchlib.interleave import (SETTLE_AFTER_SWITCH_S, WARM_UP_LABEL, WARM_UP_PROMPT, balanced_order,
                                           scheduler_policy_settings, warm_up_policies)
from vspec_cli.benchlib.policies import BenchPolicy, policy_spec
from vspec_cli.benchlib.runner import Event, file_label, step_samples_path
from vspec_cli.launch import build_launch
from vspec_cli.process import stop_group
from vspec_runtime.controller import BENCH_POLICY_FILE
from vspec_runtime.spec import RuntimeSpec, validate_spec

TARGET_SERVER = "target-only"
VSPEC_SERVER = "vspec"
SERVER_KINDS = ("target-only", "fixed", "table", "online", "profile")
HOST_MEMORY_SHARE = 0.6  # of the host's memory, for both servers together (CPU KV caches)
READY_TIMEOUT_S = 900
WARMUP_CONCURRENCY = 8
# The warm-up's drain is as wide as the server's max_num_seqs (the widest batch a load can reach), up
# to this: the demo's 16. Each K's drain runs 4 + 2 * width tokens at most.
WARM_UP_MAX_WIDTH = 16


@dataclass(frozen=True)
class ServePlan:
    base_spec: RuntimeSpec
    target_path: str
    drafter_path: Optional[str]
    policies: list[BenchPolicy]
    prompts: list[str]
    loads: list[loadlib.LoadShape]
    rounds: int
    repeats: int
    sampling: loadlib.Sampling
    out_dir: Path
    vllm_args: tuple[str, ...] = ()
    step_samples: bool = False  # the vspec server's controllers also write every verified step


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """One `vllm serve` process group, as `vspec serve` launches it, stopped with its children."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    run_dir: Path
    warm_up_gamma: Optional[int] = None  # the vspec server: the max K its warm-up drains at; None: no controller
    proc: Optional[subprocess.Popen] = None
    ready_s: Optional[float] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w", encoding="utf-8")
        self._started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with status {self.proc.returncode} "
                                   f"before it was ready (log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                    if response.status == 200:
                        self.ready_s = time.perf_counter() - self._started
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"server {self.name} not ready after {READY_TIMEOUT_S} s (log: {self.log_path})")

    def select_policy(self, label: str) -> None:
        """The label the controller runs from its next busy period on (written atomically)."""
        partial = self.run_dir / f".{BENCH_POLICY_FILE}.tmp"
        partial.write_text(label)
        os.replace(partial, self.run_dir / BENCH_POLICY_FILE)

    def metrics(self) -> dict[str, float]:
        """The counters a load is summarised with: vLLM's spec-decode totals and vspec's K selections."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as response:
            text = response.read().decode("utf-8")
        wanted: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
                                   "vllm:spec_decode_num_draft_tokens_total"):
                    wanted[sample.name] = wanted.get(sample.name, 0.0) + sample.value
                elif sample.name == "vspec_gamma_selections_total":
                    key = f"k{sample.labels['gamma']}"
                    wanted[key] = wanted.get(key, 0.0) + sample.value
        return wanted

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace=30 if self.proc.poll() is None else 0)
            self.proc.wait()
            self._log.close()


def vspec_server_spec(plan: ServePlan, trace: Path) -> tuple[RuntimeSpec, dict[str, Any]]:
    """The vspec server's spec (max K over the policies, adaptive on, trace) and its labelled policies."""
    in_vspec = [p for p in plan.policies if p.kind != "target-only"]
    measured = {p.label: scheduler_policy_settings(plan.base_spec, p) for p in in_vspec}
    gamma = max(entry["gamma"] for entry in measured.values())
    data = plan.base_spec.model_dump()
    first = next(iter(measured.values()))["adaptive"]
    samples = str(step_samples_path(trace)) if plan.step_samples else None
    data.update(gamma=gamma, adaptive=dict(first, enabled=True, trace=str(trace), samples=samples, min_gamma=0))
    # Warm-up labels first: the server starts on K=0's, so no measured policy learns from its warm-up.
    return validate_spec(data), {**warm_up_policies(plan.base_spec, gamma), **measured}


def plan_servers(plan: ServePlan, repeat: int) -> dict[str, Server]:
    servers: dict[str, Server] = {}
    wanted = {TARGET_SERVER} if any(p.kind == "target-only" for p in plan.policies) else set()
    if any(p.kind != "target-only" for p in plan.policies):
        wanted.add(VSPEC_SERVER)
    share = round(min(plan.base_spec.serving.gpu_memory_utilization or 0.3, HOST_MEMORY_SHARE / len(wanted)), 3)
    on_cpu = plan.base_spec.serving.device in (None, "cpu")
    for name in sorted(wanted):
        port = free_port()
        extra: dict[str, str] = {}
        warm_up_gamma = None
        if name == VSPEC_SERVER:
            trace = (plan.out_dir / "traces" / f"{VSPEC_SERVER}-r{repeat + 1}.jsonl").resolve()
            trace.unlink(missing_ok=True)
            step_samples_path(trace).unlink(missing_ok=True)  # the controller appends
            spec, labelled = vspec_server_spec(plan, trace)
            drafter, warm_up_gamma = plan.drafter_path, spec.gamma
            extra["VSPEC_BENCH_POLICIES"] = json.dumps(labelled)
        else:
            target = next(p for p in plan.policies if p.kind == "target-only")
            spec, drafter = policy_spec(plan.base_spec, target), None
        serving = dict(spec.serving.model_dump(), host="127.0.0.1", port=port, served_model_name="bench")
        if on_cpu:
            serving["gpu_memory_utilization"] = share
        spec = validate_spec({**spec.model_dump(), "serving": serving})
        launch = build_launch(spec, plan.target_path, drafter, plan.vllm_args)
        run_dir = (plan.out_dir / "run" / f"{name}-r{repeat + 1}").resolve()
        env = {**launch.env, **extra, "VSPEC_RUN_DIR": str(run_dir)}
        servers[name] = Server(name, launch.argv, env, port,
                               plan.out_dir / "logs" / f"{file_label(name)}-r{repeat + 1}.log", run_dir,
                               warm_up_gamma=warm_up_gamma)
    return servers


def server_of(policy: BenchPolicy) -> str:
    return TARGET_SERVER if policy.kind == "target-only" else VSPEC_SERVER


@dataclass(frozen=True)
class WarmUpLoad:
    """One load of a server's warm-up: its requests, their sampling, and the label to run it under."""

    label: Optional[str]  # a warm-up label of the vspec server; None: a server without a controller
    schedule: list[loadlib.Arrival]
    sampling: loadlib.Sampling


def warm_up_loads(prompts: list[str], sampling: loadlib.Sampling, width: int,
                  gamma: Optional[int]) -> list[WarmUpLoad]:
    """What ``warm_up`` sends one server, in order; ``gamma`` None: no controller (target-only).

    Every prompt of the pool once with two new tokens, a few at a time (its prefill, and the prompt
    in the prefix cache for every policy alike), under the K=0 label; then for each K from 0 to
    ``gamma`` a batch of ``width`` requests sent at once that stop one after another (request i after
    4 + 2i tokens, EOS ignored, the bench's temperature), so decode steps meet every batch size up to
    ``width`` at every K before a timed load does.
    """
    labels = [None] if gamma is None else [WARM_UP_LABEL.format(k) for k in range(gamma + 1)]
    short = loadlib.Sampling(max_tokens=2)
    pool = [loadlib.Arrival(0.0, prompt, i) for i, prompt in enumerate(prompts)]
    loads = [WarmUpLoad(labels[0], pool[start:start + WARMUP_CONCURRENCY], short)
             for start in range(0, len(pool), WARMUP_CONCURRENCY)]
    drain = [loadlib.Arrival(0.0, WARM_UP_PROMPT, i, max_tokens=4 + 2 * i) for i in range(width)]
    drain_sampling = replace(sampling, max_tokens=4 + 2 * (width - 1), ignore_eos=True)
    return loads + [WarmUpLoad(label, drain, drain_sampling) for label in labels]


def warm_up(server: Server, loads: list[WarmUpLoad], on_event: Event) -> None:
    """Run the warm-up loads in order; the vspec server switches label between them (when idle)."""
    for index, load in enumerate(loads):
        on_event("stage", stage="phase", phase=index, phases=len(loads),
                 name=f"{load.label or 'warm-up'} ({server.name} server)")
        if load.label is not None:
            server.select_policy(load.label)
        loadlib.run_load(server.base_url, "bench", load.schedule, load.sampling)


@dataclass
class LoadRun:
    """One policy's run of one load in one round: the paired sample of the serve bench."""

    policy: str
    load: str
    load_index: int
    repeat: int
    round: int
    order_position: int
    started_at: float
    ended_at: float
    metrics: dict[str, Any]
    counters: dict[str, float] = field(default_factory=dict)
    texts: list[Optional[str]] = field(default_factory=list)
    # Each request's TPOT in schedule order (None: failed or one token): every policy of a round got the
    # same arrivals and prompts, so request i pairs across policies (serve_report's per-request TPOT).
    tpots: list[Optional[float]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return dict(self.__dict__)


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after
            if after.get(key, 0.0) - before.get(key, 0.0) > 0}


def run_serve_bench(plan: ServePlan, on_event: Event) -> tuple[list[LoadRun], list[dict[str, Any]]]:
    """Every repeat: start the servers, warm them, run each load's rounds; returns the load runs and
    one record per server (ready time, ok, error)."""
    for sub in ("logs", "traces", "requests", "run"):
        (plan.out_dir / sub).mkdir(parents=True, exist_ok=True)
    runs: list[LoadRun] = []
    servers_seen: list[dict[str, Any]] = []
    for repeat in range(plan.repeats):
        servers = plan_servers(plan, repeat)
        try:
            for server in servers.values():
                on_event("engine", policy=f"starting {server.name} server", repeat=repeat, index=repeat,
                         total=plan.repeats)
                server.start()
            width = min(plan.base_spec.serving.max_num_seqs or WARM_UP_MAX_WIDTH, WARM_UP_MAX_WIDTH)
            for server in servers.values():
                server.wait_ready()
                warm_up(server, warm_up_loads(plan.prompts, plan.sampling, width, server.warm_up_gamma), on_event)
            runs += _loads_of_repeat(plan, servers, repeat, on_event)
            servers_seen += [{"server": s.name, "repeat": repeat, "ok": True, "ready_s": s.ready_s,
                              "log": str(s.log_path)} for s in servers.values()]
            on_event("engine-done", policy="servers", repeat=repeat, ok=True, error=None)
        except Exception as exc:  # noqa: BLE001 - reported per repeat; the other repeats still count
            servers_seen += [{"server": s.name, "repeat": repeat, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                              "log": str(s.log_path)} for s in servers.values()]
            on_event("engine-done", policy="servers", repeat=repeat, ok=False, error=str(exc))
        finally:
            for server in servers.values():
                server.stop()
    return runs, servers_seen


def _loads_of_repeat(plan: ServePlan, servers: dict[str, Server], repeat: int, on_event: Event) -> list[LoadRun]:
    labels = [p.label for p in plan.policies]
    by_label = {p.label: p for p in plan.policies}
    total = len(plan.loads) * plan.rounds * len(labels)
    done = 0
    runs: list[LoadRun] = []
    requests_file = plan.out_dir / "requests" / f"r{repeat + 1}.jsonl"
    for load_index, shape in enumerate(plan.loads):
        for round_index in range(plan.rounds):
            schedule = loadlib.arrivals(shape, plan.prompts, seed=1000 * load_index + round_index)
            for position, label in enumerate(balanced_order(labels, round_index)):
                on_event("stage", stage="phase", phase=done, phases=total,
                         name=f"{shape.label} #{round_index + 1} {label}")
                server = servers[server_of(by_label[label])]
                if server.name == VSPEC_SERVER:
                    server.select_policy(label)
                time.sleep(SETTLE_AFTER_SWITCH_S)
                run, records = _one_load(plan, server, shape, schedule, label, load_index, repeat, round_index,
                                         position)
                runs.append(run)
                with requests_file.open("a", encoding="utf-8") as raw:
                    raw.write(json.dumps({"policy": label, "load": shape.label, "round": round_index,
                                          "requests": [r.record() for r in records]}) + "\n")
                done += 1
    on_event("stage", stage="done", phases=total)
    return runs


def _one_load(plan: ServePlan, server: Server, shape: loadlib.LoadShape, schedule: list[loadlib.Arrival],
              label: str, load_index: int, repeat: int, round_index: int,
              position: int) -> tuple[LoadRun, list[loadlib.RequestRecord]]:
    """One load against one server; the run's summary and every request's record (kept apart: the
    records go to requests/, the summary to results.json)."""
    before = server.metrics() if server.name == VSPEC_SERVER else {}
    started = time.perf_counter()
    records = loadlib.run_load(server.base_url, "bench", schedule, plan.sampling, shape)
    ended = time.perf_counter()
    counters = counter_delta(before, server.metrics()) if server.name == VSPEC_SERVER else {}
    run = LoadRun(label, shape.label, load_index, repeat, round_index, position, started, ended,
                  loadlib.load_metrics(records, shape.window_s), counters,
                  texts=[r.text if r.ok else None for r in records],
                  tpots=[r.tpot if r.ok else None for r in records])
    return run, records
