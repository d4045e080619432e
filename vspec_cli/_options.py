"""Options shared by several commands, as ``Annotated`` aliases, plus the spec-override mapping.

`serve`, `bench` and `profile` take the same spec flags; each flag maps to one RuntimeSpec key
(SPEC_FLAG_KEYS) so precedence (preset < config < flags) is one dict merge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (for scripts).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would happen; change nothing.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", envvar="VSPEC_CONFIG", help="TOML file over the preset (same schema).",
                 show_default=False),
]

SPEC_PANEL = "Speculation"
ADAPTIVE_PANEL = "Adaptive controller"
SERVING_PANEL = "Serving"
EXTRAS_PANEL = "Draft/EAGLE extras"

# Flag parameter name -> dotted RuntimeSpec key.
SPEC_FLAG_KEYS: dict[str, str] = {
    "method": "method",
    "target_model": "target_model",
    "drafter": "drafter",
    "gamma": "gamma",
    "ngram_min": "ngram_min",
    "ngram_max": "ngram_max",
    "adaptive_speculation": "adaptive.enabled",
    "adaptive_policy": "adaptive.policy",
    "adaptive_profile": "adaptive.profile",
    "adaptive_min_gamma": "adaptive.min_gamma",
    "adaptive_max_gamma_step": "adaptive.max_gamma_step",
    "adaptive_control_interval": "adaptive.control_interval",
    "adaptive_hysteresis": "adaptive.hysteresis",
    "adaptive_online_window": "adaptive.online_window",
    "adaptive_online_exploration": "adaptive.online_exploration",
    "adaptive_trace": "adaptive.trace",
    "adaptive_entropy_stop": "adaptive.entropy_stop",
    "adaptive_entropy_topk": "adaptive.entropy_topk",
    "adaptive_entropy_threshold": "adaptive.entropy_threshold",
    "adaptive_entropy_scale": "adaptive.entropy_scale",
    "confidence_accept_margin": "relaxed.margin",
    "eagle_relaxed_accept_topk": "relaxed.topk",
    "confidence_accept_from_position": "relaxed.from_position",
    "confidence_accept_after_tokens": "relaxed.after_tokens",
    "confidence_protected_token_ids": "relaxed.protected_token_ids",
    "host": "serving.host",
    "port": "serving.port",
    "device": "serving.device",
    "max_num_seqs": "serving.max_num_seqs",
    "max_model_len": "serving.max_model_len",
    "max_num_batched_tokens": "serving.max_num_batched_tokens",
    "dtype": "serving.dtype",
    "gpu_memory_utilization": "serving.gpu_memory_utilization",
    "served_model_name": "serving.served_model_name",
}


def overrides_from_flags(values: dict[str, Any]) -> dict[str, Any]:
    """Nested overrides from the flags that were given (None means 'not given')."""
    nested: dict[str, Any] = {}
    for param, value in values.items():
        if value is None or param not in SPEC_FLAG_KEYS:
            continue
        if isinstance(value, Path):
            value = str(value)
        *sections, leaf = SPEC_FLAG_KEYS[param].split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def parse_token_ids(text: Optional[str]) -> Optional[list[int]]:
    """'2,50256' -> [2, 50256]."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got '{text}'") from None


# --- the spec flags, shared by serve / bench / profile -----------------------------------------
MethodOpt = Annotated[Optional[str], typer.Option(help="Drafting method: ngram, draft, eagle, eagle3, none.",
                                                  rich_help_panel=SPEC_PANEL, show_default=False)]
TargetModelOpt = Annotated[Optional[str], typer.Option("--target-model", help="Target model: a `vspec models` name, a path or a hub id.",
                                                       rich_help_panel=SPEC_PANEL, show_default=False)]
DrafterOpt = Annotated[Optional[str], typer.Option(help="Draft model or EAGLE head (name or path).",
                                                   rich_help_panel=SPEC_PANEL, show_default=False)]
GammaOpt = Annotated[Optional[int], typer.Option(help="Maximum K (vLLM's num_speculative_tokens).",
                                                 rich_help_panel=SPEC_PANEL, show_default=False)]
NgramMinOpt = Annotated[Optional[int], typer.Option(help="Smallest n-gram to match (ngram).", rich_help_panel=SPEC_PANEL, show_default=False)]
NgramMaxOpt = Annotated[Optional[int], typer.Option(help="Largest n-gram to match (ngram).", rich_help_panel=SPEC_PANEL, show_default=False)]

AdaptiveOpt = Annotated[Optional[bool], typer.Option("--adaptive-speculation/--no-adaptive-speculation",
                                                     help="Let the controller choose K every step.",
                                                     rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptivePolicyOpt = Annotated[Optional[str], typer.Option(help="online, profile, fixed or table.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveProfileOpt = Annotated[Optional[Path], typer.Option(help="Profile JSON for --adaptive-policy profile.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveMinGammaOpt = Annotated[Optional[int], typer.Option(help="Smallest K the controller may pick (0 = speculation off).", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveMaxStepOpt = Annotated[Optional[int], typer.Option(help="Largest change of K per decision.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveIntervalOpt = Annotated[Optional[int], typer.Option(help="Decode steps between decisions.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveHysteresisOpt = Annotated[Optional[float], typer.Option(help="Switch only when the best K beats the current one by this fraction.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveWindowOpt = Annotated[Optional[int], typer.Option(help="Samples per K in the online policy's sliding window.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveExplorationOpt = Annotated[Optional[float], typer.Option(help="UCB exploration weight of the online policy.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
AdaptiveTraceOpt = Annotated[Optional[Path], typer.Option(help="Write one JSON line per decision to this file.", rich_help_panel=ADAPTIVE_PANEL, show_default=False)]
EntropyStopOpt = Annotated[Optional[bool], typer.Option("--adaptive-entropy-stop/--no-adaptive-entropy-stop", help="Per-request confidence stop (lossless).", rich_help_panel=EXTRAS_PANEL, show_default=False)]
EntropyTopkOpt = Annotated[Optional[int], typer.Option(help="Top-k for the draft entropy.", rich_help_panel=EXTRAS_PANEL, show_default=False)]
EntropyThresholdOpt = Annotated[Optional[float], typer.Option(help="Stop when entropy*scale > threshold^2.", rich_help_panel=EXTRAS_PANEL, show_default=False)]
EntropyScaleOpt = Annotated[Optional[float], typer.Option(help="Scale of the entropy test.", rich_help_panel=EXTRAS_PANEL, show_default=False)]
AcceptMarginOpt = Annotated[Optional[float], typer.Option(help="Relaxed acceptance: accept drafts within this logit margin (CHANGES OUTPUTS).", rich_help_panel=EXTRAS_PANEL, show_default=False)]
AcceptTopkOpt = Annotated[Optional[int], typer.Option(help="Relaxed acceptance: accept drafts in the target's top-k (CHANGES OUTPUTS).", rich_help_panel=EXTRAS_PANEL, show_default=False)]
AcceptFromPositionOpt = Annotated[Optional[int], typer.Option(help="Relaxed acceptance only from this draft position.", rich_help_panel=EXTRAS_PANEL, show_default=False)]
AcceptAfterTokensOpt = Annotated[Optional[int], typer.Option(help="Relaxed acceptance only after this many generated tokens.", rich_help_panel=EXTRAS_PANEL, show_default=False)]
ProtectedIdsOpt = Annotated[Optional[str], typer.Option(help="Token ids never accepted by relaxation, comma-separated.", rich_help_panel=EXTRAS_PANEL, show_default=False)]

HostOpt = Annotated[Optional[str], typer.Option(help="Address to listen on.", rich_help_panel=SERVING_PANEL, show_default=False)]
PortOpt = Annotated[Optional[int], typer.Option(help="Port to listen on.", rich_help_panel=SERVING_PANEL, show_default=False)]
DeviceOpt = Annotated[Optional[str], typer.Option(help="'cpu', or accelerator ids like '0,1' (sets the platform's visible-devices variable).", rich_help_panel=SERVING_PANEL, show_default=False)]
MaxNumSeqsOpt = Annotated[Optional[int], typer.Option(help="Most concurrent requests in a batch.", rich_help_panel=SERVING_PANEL, show_default=False)]
MaxModelLenOpt = Annotated[Optional[int], typer.Option(help="Context length.", rich_help_panel=SERVING_PANEL, show_default=False)]
MaxBatchedTokensOpt = Annotated[Optional[int], typer.Option(help="Most tokens in one step (bounds B*(K+1)).", rich_help_panel=SERVING_PANEL, show_default=False)]
DtypeOpt = Annotated[Optional[str], typer.Option(help="Model dtype (float32 on CPU for exact equality).", rich_help_panel=SERVING_PANEL, show_default=False)]
GpuMemOpt = Annotated[Optional[float], typer.Option(help="Share of accelerator memory (on CPU: of host memory).", rich_help_panel=SERVING_PANEL, show_default=False)]
ServedNameOpt = Annotated[Optional[str], typer.Option(help="Model name clients use.", rich_help_panel=SERVING_PANEL, show_default=False)]
