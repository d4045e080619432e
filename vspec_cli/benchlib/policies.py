"""Policy strings of `vspec bench --policies` and the RuntimeSpec each one runs with.

``target-only``      no speculation (method none, no drafter, no controller)
``fixed:K``          K=K every step; ``fixed:1-6`` is a sweep. Interleaved mode (the default) runs it
                     through vspec's scheduler as a constant-K policy, so it differs from the adaptive
                     policies only in K; ``--mode engines`` runs plain vLLM with num_speculative_tokens=K
``vllm-fixed:K``     plain vLLM with num_speculative_tokens=K, no vspec scheduler (a labelled baseline)
``table:B=K,...``    vLLM's batch-size table through the controller's table policy, e.g. ``table:1=6,8=1``
``online``           the online controller (bandit over K)
``per-request``      the online controller choosing the most any request drafts, and per-request draft
                     lengths (adaptive.per_request) trimming each request's draft to where it pays
``profile:PATH``     the profile controller with that profile JSON
``online:KEY=VALUE,...``  (also ``per-request:...``) the online controller with adaptive settings
                     changed, to put two settings side by side in one run, e.g.
                     ``online,online:batch_acceptance=false`` or ``online:hysteresis=0.1,online_window=16``;
                     KEY is a field of the spec's [adaptive] section, VALUE as in a config file

Adaptive policies keep the base spec's gamma (max K) and its other adaptive settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vspec_cli._errors import UserInputError
from vspec_runtime.spec import MAX_GAMMA, RuntimeSpec, SpecError, validate_spec

POLICY_SYNTAX = ("target-only, fixed:K, fixed:K1-K2, vllm-fixed:K, table:B=K[,B=K...], online, per-request, "
                 "online:KEY=VALUE[,KEY=VALUE...], profile:PATH")
_TABLE_ENTRY = re.compile(r"^\s*(\d+)\s*=\s*(\d+)\s*$")
_SETTING_ENTRY = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*=\s*(.+?)\s*$")
# What the bench itself sets for every policy: not open to online:KEY=VALUE.
_BENCH_OWNED_SETTINGS = frozenset({"enabled", "policy", "profile", "table", "fixed_gamma", "sweep_gammas", "trace",
                                   "samples", "per_request"})


@dataclass(frozen=True)
class BenchPolicy:
    label: str  # as written in reports, e.g. "fixed:3"
    kind: str  # target-only | fixed | vllm-fixed | table | online | profile (per-request: online + lengths)
    gamma: Optional[int] = None  # fixed:K
    table: dict[int, int] = field(default_factory=dict)  # table:...
    profile: Optional[str] = None  # profile:PATH
    per_request: bool = False  # per-request draft lengths under the policy's K
    settings: tuple[tuple[str, Any], ...] = ()  # online:KEY=VALUE: adaptive settings changed for this policy

    @property
    def adaptive(self) -> bool:
        return self.kind in ("table", "online", "profile")

    @property
    def speculating(self) -> bool:
        return self.kind != "target-only"


def parse_policies(text: str) -> list[BenchPolicy]:
    """'target-only,fixed:1-3,table:1=6,8=1,online' -> policies (duplicates dropped, order kept).

    Commas separate policies, except that ``B=K`` items continue the table before them.
    """
    items = [item.strip() for item in text.split(",")]
    grouped: list[str] = []
    for item in items:
        if not item:
            continue
        if _continues(item, grouped[-1] if grouped else ""):
            grouped[-1] += "," + item
        else:
            grouped.append(item)
    if not grouped:
        raise UserInputError(f"--policies: give at least one policy ({POLICY_SYNTAX})")
    policies: dict[str, BenchPolicy] = {}
    for item in grouped:
        for policy in _parse_one(item):
            policies.setdefault(policy.label, policy)
    return list(policies.values())


def _continues(item: str, previous: str) -> bool:
    """Whether ``item`` is one more entry of the table or settings list before it."""
    if previous.startswith("table:"):
        return bool(_TABLE_ENTRY.match(item))
    if previous.startswith(("online:", "per-request:")):
        return bool(_SETTING_ENTRY.match(item)) and ":" not in item.partition("=")[0]
    return False


def _parse_one(item: str) -> list[BenchPolicy]:
    name, _, arg = item.partition(":")
    name = name.strip().lower()
    if name in ("target-only", "online") and not arg:
        return [BenchPolicy(name, name)]
    if name == "per-request" and not arg:
        return [BenchPolicy(name, "online", per_request=True)]
    if name in ("online", "per-request"):
        settings = _parse_settings(arg, item)
        label = name + ":" + ",".join(f"{key}={text}" for key, text, _ in settings)
        return [BenchPolicy(label, "online", per_request=name == "per-request",
                            settings=tuple((key, value) for key, _, value in settings))]
    if name in ("fixed", "vllm-fixed") and arg:
        return [BenchPolicy(f"{name}:{k}", name, gamma=k) for k in _fixed_range(arg, item)]
    if name == "table" and arg:
        table = _parse_table(arg, item)
        label = "table:" + ",".join(f"{b}={k}" for b, k in sorted(table.items()))
        return [BenchPolicy(label, "table", table=table)]
    if name == "profile" and arg:
        path = Path(arg).expanduser()
        if not path.is_file():
            raise UserInputError(f"policy '{item}': profile file {path} does not exist",
                                 hint="`vspec profile collect` then `vspec fit` make one")
        return [BenchPolicy(item, "profile", profile=str(path.resolve()))]
    raise UserInputError(f"unknown policy '{item}'; use {POLICY_SYNTAX}")


def _parse_settings(arg: str, item: str) -> list[tuple[str, str, Any]]:
    """'batch_acceptance=false,hysteresis=0.1' -> [(key, text as written, value)], checked by the spec."""
    from vspec_cli.spec_flags import all_spec_fields, parse_set_value

    fields = all_spec_fields()
    settings = []
    for entry in arg.split(","):
        match = _SETTING_ENTRY.match(entry)
        if not match:
            raise UserInputError(f"policy '{item}': settings look like KEY=VALUE, e.g. online:hysteresis=0.1")
        key, text = match.groups()
        field = fields.get(f"adaptive.{key}")
        if field is None or key in _BENCH_OWNED_SETTINGS:
            open_keys = sorted(k.split(".", 1)[1] for k in fields
                               if k.startswith("adaptive.") and k.split(".", 1)[1] not in _BENCH_OWNED_SETTINGS)
            raise UserInputError(f"policy '{item}': '{key}' is not an adaptive setting the bench leaves open",
                                 hint="one of " + ", ".join(open_keys))
        settings.append((key, text, parse_set_value(field, text)))
    return settings


def _fixed_range(arg: str, item: str) -> list[int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", arg)
    if not match:
        raise UserInputError(f"policy '{item}': expected fixed:K or fixed:K1-K2 with integers")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if low > high:
        raise UserInputError(f"policy '{item}': the range {low}-{high} is empty")
    if low < 1 or high > MAX_GAMMA:
        raise UserInputError(f"policy '{item}': K must be in 1..{MAX_GAMMA} (K=0 is target-only)")
    return list(range(low, high + 1))


def _parse_table(arg: str, item: str) -> dict[int, int]:
    table: dict[int, int] = {}
    for entry in arg.split(","):
        match = _TABLE_ENTRY.match(entry)
        if not match:
            raise UserInputError(f"policy '{item}': table entries look like BATCH=K, e.g. table:1=6,8=1")
        batch, k = int(match.group(1)), int(match.group(2))
        if batch < 1:
            raise UserInputError(f"policy '{item}': batch sizes start at 1")
        table[batch] = k
    return table


def policy_spec(base: RuntimeSpec, policy: BenchPolicy, trace: Optional[Path] = None,
                samples: Optional[Path] = None) -> RuntimeSpec:
    """The spec ``policy`` runs with: the base spec with its method, gamma and controller replaced;
    an adaptive policy writes its decisions to ``trace`` and, if given, every verified step to ``samples``."""
    data: dict[str, Any] = base.model_dump()
    adaptive = dict(data["adaptive"], enabled=policy.adaptive, profile=None, table=None, fixed_gamma=None,
                    sweep_gammas=None, trace=None, samples=None, per_request=policy.per_request)
    if policy.kind == "target-only":
        data.update(method="none", drafter=None, relaxed={})
        adaptive["entropy_stop"] = False
    elif not base.speculating:
        raise UserInputError(f"policy '{policy.label}' needs a drafting method; the spec has method 'none'",
                             hint="pick a preset with a drafter, or add --method ngram")
    if policy.kind in ("fixed", "vllm-fixed"):
        data["gamma"] = policy.gamma
        adaptive["min_gamma"] = min(adaptive["min_gamma"], policy.gamma)
    elif policy.adaptive:
        adaptive.update(policy.settings)
        adaptive["policy"] = policy.kind
        adaptive["trace"] = str(trace) if trace else None
        adaptive["samples"] = str(samples) if samples else None
        if policy.kind == "table":
            adaptive["table"] = policy.table
        if policy.kind == "profile":
            adaptive["profile"] = policy.profile
    data["adaptive"] = adaptive
    try:
        return validate_spec(data)
    except SpecError as exc:
        raise UserInputError(f"policy '{policy.label}': {exc}") from None
