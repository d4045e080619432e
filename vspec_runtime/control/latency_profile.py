"""The latency profile format (``vspec-profile/1``) read by the profile policy.

A profile is a JSON object measured on one machine for one target (and drafter):

    {
      "schema": "vspec-profile/1",
      "target":  {"alpha": 0.00002, "c": 0.011, "delta": 18.5},
      "drafter": {"alpha": 0.000004, "c": 0.002, "delta": 1.9},
      "overhead_ms_per_k": {"0": 0.0, "1": 0.35, "4": 0.6},
      "max_gamma": 6,
      "table": {"1": 6, "8": 3, "32": 1},
      "meta": {"target_model": "...", "device": "...", "created": "..."}
    }

* ``target``, ``drafter``: one forward of that model costs T(ctx, n) = alpha*ctx + c*n + delta
  milliseconds, ctx = context tokens summed over the batch, n = tokens processed in the forward.
  The collector fits [ctx, n, 1] by non-negative least squares. ``drafter`` is ``null`` for
  drafters without a model (ngram): their drafting time is in the overhead.
* ``overhead_ms_per_k`` (optional): extra milliseconds per step when running with K drafts
  (sampling, bookkeeping). A K not listed uses the nearest listed K below it, or 0.
* ``max_gamma``: the largest K the profile covers.
* ``table`` (optional): batch size -> K, used by the policy before any acceptance data exists (as
  vLLM's num_speculative_tokens_per_batch_size: the entry of the largest listed batch size <= B).
* ``meta`` (optional): free-form provenance; never read by the policy.

Step latency for B requests and K drafts:

    T_step(K) = K * drafter(ctx, B) + target(ctx, B*(K+1)) + overhead(K)

``LatencyProfile.from_dict`` validates and raises ValueError with a one-line message naming the
field (given the server's maximum K, also a table entry above it); ``to_dict`` writes the same
shape back (the collector, vspec_cli/profiling/fit.py, uses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PROFILE_SCHEMA = "vspec-profile/1"
_PROFILE_KEYS = ("schema", "target", "drafter", "overhead_ms_per_k", "max_gamma", "table", "meta")
_COMPONENT_KEYS = ("alpha", "c", "delta")
_MAX_GAMMA_LIMIT = 64


@dataclass(frozen=True)
class ComponentLatency:
    """T(ctx, n) = alpha*ctx + c*n + delta milliseconds for one forward."""

    alpha: float  # ms per context token (summed over the batch)
    c: float  # ms per token processed
    delta: float  # ms per forward, whatever its size

    def forward_ms(self, context_tokens: float, batched_tokens: float) -> float:
        return self.alpha * context_tokens + self.c * batched_tokens + self.delta

    def to_dict(self) -> dict[str, float]:
        return {"alpha": self.alpha, "c": self.c, "delta": self.delta}


@dataclass(frozen=True)
class LatencyProfile:
    """A validated ``vspec-profile/1`` document."""

    target: ComponentLatency
    drafter: ComponentLatency | None
    max_gamma: int
    overhead_ms_per_k: dict[int, float] = field(default_factory=dict)
    table: dict[int, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, serving_max_gamma: int | None = None) -> LatencyProfile:
        """Validate ``data``; with ``serving_max_gamma`` (the server's num_speculative_tokens) also
        reject a table entry above it: that prior would name a K the server cannot run. A profile
        measured to a larger K than the server's is fine; the policy never goes above the server's."""
        profile = cls._from_dict(data)
        if serving_max_gamma is not None:
            profile.check_serving_gamma(serving_max_gamma)
        return profile

    def check_serving_gamma(self, serving_max_gamma: int) -> None:
        for batch, gamma in sorted(self.table.items()):
            if gamma > serving_max_gamma:
                raise ValueError(
                    f"profile.table: entry {batch} -> {gamma} is above the server's maximum K ({serving_max_gamma}); "
                    f"re-fit with `vspec fit SAMPLES --max-gamma {serving_max_gamma}` or serve with a larger --gamma"
                )

    @classmethod
    def _from_dict(cls, data: Any) -> LatencyProfile:
        if not isinstance(data, dict):
            raise ValueError(f"profile: expected a JSON object, got {type(data).__name__}")
        unknown = [key for key in data if key not in _PROFILE_KEYS]
        if unknown:
            raise ValueError(f"profile: unknown key '{unknown[0]}' (allowed: {', '.join(_PROFILE_KEYS)})")
        if data.get("schema") != PROFILE_SCHEMA:
            raise ValueError(f"profile.schema: got {data.get('schema')!r}; expected '{PROFILE_SCHEMA}'")
        if "target" not in data:
            raise ValueError("profile.target: missing; the target model's {alpha, c, delta} are required")
        max_gamma = _parse_max_gamma(data.get("max_gamma"))
        drafter = data.get("drafter")
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"profile.meta: got {type(meta).__name__}; expected an object")
        return cls(
            target=_parse_component("target", data["target"]),
            drafter=None if drafter is None else _parse_component("drafter", drafter),
            max_gamma=max_gamma,
            overhead_ms_per_k=_parse_overheads(data.get("overhead_ms_per_k") or {}, max_gamma),
            table=_parse_table(data.get("table") or {}, max_gamma),
            meta=dict(meta),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": PROFILE_SCHEMA,
            "target": self.target.to_dict(),
            "drafter": None if self.drafter is None else self.drafter.to_dict(),
            "max_gamma": self.max_gamma,
        }
        if self.overhead_ms_per_k:
            data["overhead_ms_per_k"] = {str(k): v for k, v in sorted(self.overhead_ms_per_k.items())}
        if self.table:
            data["table"] = {str(batch): k for batch, k in sorted(self.table.items())}
        if self.meta:
            data["meta"] = dict(self.meta)
        return data

    def overhead_ms(self, gamma: int) -> float:
        listed = [k for k in self.overhead_ms_per_k if k <= gamma]
        return self.overhead_ms_per_k[max(listed)] if listed else 0.0

    def step_ms(self, batch_size: int, gamma: int, context_tokens: float = 0.0) -> float:
        """Predicted milliseconds of one step: K draft forwards, one verification, the overhead."""
        drafting = 0.0
        if gamma and self.drafter is not None:
            drafting = gamma * self.drafter.forward_ms(context_tokens, batch_size)
        verification = self.target.forward_ms(context_tokens, batch_size * (gamma + 1))
        return drafting + verification + self.overhead_ms(gamma)

    def table_gamma(self, batch_size: int) -> int | None:
        """The table's K for ``batch_size`` (None without a table)."""
        return table_lookup(self.table, batch_size) if self.table else None


def table_lookup(table: dict[int, int], batch_size: int) -> int:
    """vLLM's rule: the entry of the largest listed batch size <= batch_size, else the smallest entry."""
    listed = [batch for batch in table if batch <= batch_size]
    return table[max(listed)] if listed else table[min(table)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_component(name: str, data: Any) -> ComponentLatency:
    if not isinstance(data, dict):
        raise ValueError(f"profile.{name}: got {type(data).__name__}; expected an object with alpha, c, delta")
    unknown = [key for key in data if key not in _COMPONENT_KEYS]
    if unknown:
        raise ValueError(f"profile.{name}: unknown key '{unknown[0]}' (allowed: alpha, c, delta)")
    values = {}
    for key in _COMPONENT_KEYS:
        if key not in data:
            raise ValueError(f"profile.{name}.{key}: missing")
        value = data[key]
        if not _is_number(value) or value < 0:
            raise ValueError(f"profile.{name}.{key}: got {value!r}; must be a finite number >= 0")
        values[key] = float(value)
    return ComponentLatency(**values)


def _parse_max_gamma(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_GAMMA_LIMIT:
        raise ValueError(f"profile.max_gamma: got {value!r}; must be an integer in [0, {_MAX_GAMMA_LIMIT}]")
    return value


def _parse_int_key(section: str, key: Any) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(f"profile.{section}: key {key!r} is not an integer") from None


def _parse_overheads(data: Any, max_gamma: int) -> dict[int, float]:
    if not isinstance(data, dict):
        raise ValueError(f"profile.overhead_ms_per_k: got {type(data).__name__}; expected an object K -> ms")
    overheads = {}
    for key, value in data.items():
        gamma = _parse_int_key("overhead_ms_per_k", key)
        if not 0 <= gamma <= max_gamma:
            raise ValueError(f"profile.overhead_ms_per_k: K {gamma} outside [0, max_gamma={max_gamma}]")
        if not _is_number(value) or value < 0:
            raise ValueError(f"profile.overhead_ms_per_k.{gamma}: got {value!r}; must be a finite number >= 0")
        overheads[gamma] = float(value)
    return overheads


def _parse_table(data: Any, max_gamma: int) -> dict[int, int]:
    if not isinstance(data, dict):
        raise ValueError(f"profile.table: got {type(data).__name__}; expected an object batch size -> K")
    table = {}
    for key, value in data.items():
        batch = _parse_int_key("table", key)
        valid_k = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= max_gamma
        if batch < 1 or not valid_k:
            raise ValueError(
                f"profile.table: entry {key} -> {value!r}; need batch >= 1 and 0 <= K <= max_gamma ({max_gamma})"
            )
        table[batch] = value
    return table
