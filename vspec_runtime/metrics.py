"""vspec_* series on vLLM's /metrics.

The controller lives in the engine-core process; /metrics is served by the API-server process.
The controller publishes a small JSON snapshot (``$VSPEC_RUN_DIR/controller.json``, replaced
atomically a few times a second at most) and a Prometheus collector registered in every vspec
process reads it at scrape time. No shared memory, no extra port, and no dependence on vLLM's stats
plumbing. Limitation: with PROMETHEUS_MULTIPROC_DIR (several API servers) vLLM serves its own
registry and these series are absent.

Data parallelism runs one controller per DP rank (vspec_runtime/parallel.py): rank r > 0 publishes
``controller.dp<r>.json`` beside rank 0's file. The series above are rank 0's; ``vspec_rank_*`` carry
every rank's layout, K and steps, labelled ``dp_rank``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from vspec_runtime import envs

SNAPSHOT_NAME = "controller.json"
RANK_SNAPSHOT_NAME = "controller.dp{}.json"
_collector_registered = False


def snapshot_path(dp_rank: int = 0) -> Optional[Path]:
    run_dir = envs.get("VSPEC_RUN_DIR")
    if not run_dir:
        return None
    return Path(run_dir) / (SNAPSHOT_NAME if dp_rank == 0 else RANK_SNAPSHOT_NAME.format(dp_rank))


def publish(snapshot: dict[str, Any]) -> None:
    """Atomically replace the snapshot (engine-core side), one file per data-parallel rank."""
    path = snapshot_path(int(snapshot.get("ranks", {}).get("dp_rank", 0)))
    if path is None:
        return
    fd, tmp = tempfile.mkstemp(prefix=".controller.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(snapshot, handle)
    os.replace(tmp, path)


def read_snapshot() -> Optional[dict[str, Any]]:
    path = snapshot_path()
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class VspecCollector:
    """prometheus_client custom collector: turns the latest snapshot into vspec_* families."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        snap = read_snapshot()
        if not snap:
            return
        info = InfoMetricFamily("vspec", "vspec runtime configuration")
        info.add_metric([], {"method": str(snap.get("method", "")), "policy": str(snap.get("policy", "")),
                             "relaxed_acceptance": "on" if snap.get("relaxed") else "off"})
        yield info
        yield GaugeMetricFamily("vspec_current_gamma", "Speculation length K the controller chose last",
                                value=float(snap.get("gamma", 0)))
        yield GaugeMetricFamily("vspec_max_gamma", "Largest K this server may use", value=float(snap.get("max_gamma", 0)))
        selections = CounterMetricFamily("vspec_gamma_selections", "Scheduled steps per chosen K", labels=["gamma"])
        for gamma, count in sorted(snap.get("selections", {}).items(), key=lambda kv: int(kv[0])):
            selections.add_metric([str(gamma)], float(count))
        yield selections
        yield CounterMetricFamily("vspec_gamma_switches", "Times the controller changed K", value=float(snap.get("switches", 0)))
        yield CounterMetricFamily("vspec_decode_steps", "Steps seen by the controller", value=float(snap.get("steps", 0)))
        rewards = GaugeMetricFamily("vspec_reward_tokens_per_ms", "Measured goodput estimate per K (committed tokens per ms)",
                                    labels=["gamma"])
        for gamma, value in sorted(snap.get("rewards", {}).items(), key=lambda kv: int(kv[0])):
            if value is not None:
                rewards.add_metric([str(gamma)], float(value))
        yield rewards
        yield GaugeMetricFamily("vspec_controller_faulted", "1 when the policy failed and K is frozen",
                                value=1.0 if snap.get("faulted") else 0.0)
        yield CounterMetricFamily("vspec_confidence_cut_requests", "Request drafts cut short by the confidence stop",
                                  value=float(snap.get("confidence_cut_requests", 0)))
        yield CounterMetricFamily("vspec_confidence_dropped_drafts", "Draft tokens the confidence stop dropped",
                                  value=float(snap.get("confidence_dropped_drafts", 0)))
        yield from _per_request_families(snap.get("per_request"))
        yield GaugeMetricFamily("vspec_relaxed_acceptance_enabled", "1 when relaxed (output-changing) acceptance is on",
                                value=1.0 if snap.get("relaxed") else 0.0)
        yield from _rank_families([snap, *rank_snapshots()])


def rank_snapshots() -> list[dict[str, Any]]:
    """The snapshots of data-parallel ranks other than 0, in rank order."""
    path = snapshot_path()
    found = []
    for rank_file in sorted(path.parent.glob(RANK_SNAPSHOT_NAME.format("*"))) if path else []:
        try:
            found.append(json.loads(rank_file.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now: the next scrape reads it
    return found


def _rank_families(snapshots: list[dict[str, Any]]) -> Iterator[Any]:
    """Per rank: its layout (vspec_runtime/parallel.py rank_layout), its K and its steps. Absent when
    no snapshot names its ranks (a controller built outside vLLM's scheduler)."""
    ranked = [snap for snap in snapshots if snap.get("ranks")]
    if not ranked:
        return
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    info = InfoMetricFamily("vspec_rank", "Ranks a controller serves: its DP rank and the TP/PP workers behind it")
    gamma = GaugeMetricFamily("vspec_rank_current_gamma", "K the controller of this DP rank chose last",
                              labels=["dp_rank"])
    steps = CounterMetricFamily("vspec_rank_decode_steps", "Steps seen by the controller of this DP rank",
                                labels=["dp_rank"])
    for snap in ranked:
        ranks = snap["ranks"]
        rank = str(ranks.get("dp_rank", 0))
        info.add_metric([], {key: str(value) for key, value in ranks.items()})
        gamma.add_metric([rank], float(snap.get("gamma", 0)))
        steps.add_metric([rank], float(snap.get("steps", 0)))
    yield from (info, gamma, steps)


def _per_request_families(per_request: Optional[dict[str, Any]]) -> Iterator[Any]:
    """Per-request draft lengths (adaptive.per_request): drafts offered and kept, the lengths requests
    got, verification slots by acceptance band of the request, and the step-cost line used."""
    if not per_request:
        return
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield CounterMetricFamily("vspec_per_request_offered_drafts", "Draft tokens the drafter made for verification",
                              value=float(per_request.get("offered_drafts", 0)))
    yield CounterMetricFamily("vspec_per_request_kept_drafts", "Draft tokens kept after per-request trimming",
                              value=float(per_request.get("kept_drafts", 0)))
    lengths = CounterMetricFamily("vspec_per_request_lengths", "Request-steps per draft length kept", labels=["length"])
    for length, count in sorted(per_request.get("lengths", {}).items(), key=lambda kv: int(kv[0])):
        lengths.add_metric([str(length)], float(count))
    yield lengths
    bands = CounterMetricFamily("vspec_per_request_slots_by_band",
                                "Verified draft slots by the request's estimated first-draft acceptance "
                                "(low < 0.3 <= mid < 0.7 <= high)", labels=["band"])
    for band, count in sorted(per_request.get("slots_by_band", {}).items()):
        bands.add_metric([band], float(count))
    yield bands
    line = per_request.get("cost_line_ms")
    if line:
        cost = GaugeMetricFamily("vspec_per_request_step_cost_ms", "Step-cost line: fixed ms and ms per verified token",
                                 labels=["term"])
        cost.add_metric(["fixed"], float(line[0]))
        cost.add_metric(["per_token"], float(line[1]))
        yield cost


def register_collector() -> None:
    global _collector_registered
    if _collector_registered:
        return
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    REGISTRY.register(VspecCollector())
    _collector_registered = True
