"""RuntimeSpec: the one typed contract between the `vspec` CLI and the runtime inside vLLM.

The CLI resolves preset < config file < flags into a plain dict, validates it here, and ships it to
the vLLM processes as JSON in ``VSPEC_SPEC``. The runtime parses it back with the same model, so both
sides agree on every field and default. No vLLM import here: the CLI and the tests load it cheaply.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SPEC_SCHEMA_VERSION = 1
MAX_GAMMA = 16  # vLLM sizes buffers from num_speculative_tokens; beyond 16 nothing pays off.

Method = Literal["ngram", "draft", "eagle", "eagle3", "none"]
PolicyName = Literal["online", "profile", "fixed", "table", "sweep"]
METHODS_WITH_DRAFTER = ("draft", "eagle", "eagle3")


class SpecError(ValueError):
    """A spec that does not validate; the message is one line naming field, value and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class AdaptiveSettings(_Strict):
    """How the controller picks K each step (see docs/architecture.md, "Controller maths")."""

    enabled: bool = Field(False, description="Let the controller choose K every step.")
    policy: PolicyName = Field("online", description="How the controller chooses K.")
    profile: Optional[str] = Field(None, description="Latency profile JSON for policy profile.")
    min_gamma: int = Field(0, ge=0, le=MAX_GAMMA,
                           description="Smallest K the controller may pick (0 = speculation off).")
    max_gamma_step: int = Field(2, ge=1, le=MAX_GAMMA, description="Largest change of K per decision.")
    control_interval: int = Field(4, ge=1, le=10_000, description="Decode steps between decisions.")
    hysteresis: float = Field(0.05, ge=0.0, le=1.0,
                              description="Switch only when the best K beats the current one by this fraction.")
    online_window: int = Field(32, ge=2, le=100_000,
                               description="Samples per K in the online policy's sliding window.")
    online_exploration: float = Field(0.01, ge=0.0, le=10.0,
                                      description="UCB exploration weight (c) of the online policy.")
    model_guided: bool = Field(True, description="Online policy: predict unmeasured K from the acceptance "
                                                 "model and skip hopeless ones.")
    batch_acceptance: bool = Field(True, description="Online policy: expect from the requests in the batch "
                                                     "what they accepted, not what recent requests did.")
    token_costs: bool = Field(True, description="Online policy: price each K by a line of step cost against "
                                                "verified tokens over the latest steps (where the drafter's "
                                                "fills vary, n-gram), not by that K's own window.")
    coverage_weighting: bool = Field(True, description="Online policy, n-gram lookup: read E[K] per token of the "
                                                       "text recent steps covered, not per step (a larger K "
                                                       "crosses the runs it copies in fewer steps). Model "
                                                       "drafters draft anew each step: not applied to them.")
    acceptance_model: Literal["step", "run"] = Field(
        "step", description="Online policy: number draft positions per step, or along runs of copyable text "
                            "(n-gram lookup; opt-in until a bench resolves a gain).")
    visit_value: bool = Field(True, description="Online policy: visit a K for information (exploring past "
                                                "warm-up, firming up a thin estimate) only when what it may "
                                                "gain over the regime's expected length outweighs the visit's "
                                                "cost.")
    firm_up_follow_through: bool = Field(False, description="Online policy: a firm-up of a thin K more than "
                                                            "max_gamma_step away goes on to it over the next "
                                                            "decisions, instead of being undone at the K between "
                                                            "(opt-in until a bench resolves a gain).")
    batch_normalized_costs: bool = Field(False, description="Online policy: price a step of a batch smaller "
                                                            "than its bucket (a draining or filling batch) as if "
                                                            "the bucket's full batch had shared its fixed cost "
                                                            "(opt-in until a bench resolves a gain).")
    start_gamma: Optional[int] = Field(
        None, ge=0, le=MAX_GAMMA, description="Online policy: K of the engine's first decisions (default: the "
                                              "maximum K, vLLM's own choice).")
    gamma0_mode: Literal["sticky", "sync"] = Field(
        "sticky", description="Model drafters' K=0: sticky holds it until the batch drains, sync asks every step.")
    gamma0_reprobe_steps: int = Field(
        256, ge=0, le=1_000_000, description="Sticky K=0: ask the policy again after this many held steps "
                                             "(doubling after each probe that ends at K=0) when the batch never "
                                             "drains; 0: only when it drains.")
    fixed_gamma: Optional[int] = Field(None, ge=0, le=MAX_GAMMA, description="K for policy fixed (default: gamma).")
    table: Optional[dict[int, int]] = Field(None, description="Policy table: batch size -> K (vLLM's lookup).")
    trace: Optional[str] = Field(None, description="Write one JSON line per decision to this file.")
    samples: Optional[str] = Field(None, description="Write one JSON line per verified step to this file "
                                                     "(profiling input).")
    sweep_gammas: Optional[tuple[int, ...]] = Field(
        None, description="Policy sweep: the K values cycled, control_interval steps each.")
    seed: int = Field(0, description="Seed of the online policy's random choices.")
    per_request: bool = Field(False, description="Trim each request's draft to where it pays (lossless).")
    # Confidence stop (lossless): cut a request's draft at the first uncertain position.
    entropy_stop: bool = Field(False, description="Confidence stop (lossless): cut a request's draft at the "
                                                  "first uncertain position; model drafters only.")
    entropy_topk: int = Field(2, ge=2, le=64, description="Confidence stop: top-k of the draft entropy.")
    entropy_threshold: float = Field(0.3, gt=0.0, description="Confidence stop: stop when entropy*scale > "
                                                              "threshold^2.")
    entropy_scale: float = Field(0.15, gt=0.0, description="Confidence stop: scale of the entropy test.")


class RelaxedAcceptance(_Strict):
    """Opt-in acceptance of near-miss drafts under greedy decoding. Changes outputs."""

    margin: Optional[float] = Field(None, gt=0.0, description="Accept a draft whose target logit is within "
                                                              "this margin of the top (CHANGES OUTPUTS).")
    topk: Optional[int] = Field(None, ge=1, le=64, description="Accept a draft in the target's top-k "
                                                               "(CHANGES OUTPUTS).")
    from_position: int = Field(0, ge=0, description="Relax only draft positions >= this (0-based).")
    after_tokens: int = Field(0, ge=0, description="Relax only once the request generated this many tokens.")
    protected_token_ids: tuple[int, ...] = Field((), description="Token ids never accepted by relaxation "
                                                                 "(EOS, tool tags, ...).")

    @property
    def enabled(self) -> bool:
        return self.margin is not None or self.topk is not None


class ServingSettings(_Strict):
    """What `vllm serve` gets besides the speculative config."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    device: Optional[str] = Field(None, description="'cpu', or accelerator ids like '0,1' (sets the platform's "
                                                    "visible-devices variable).")
    max_num_seqs: Optional[int] = Field(None, ge=1, description="Most concurrent requests in a batch.")
    max_model_len: Optional[int] = Field(None, ge=16, description="Context length.")
    max_num_batched_tokens: Optional[int] = Field(None, ge=16, description="Most tokens in one step "
                                                                           "(bounds B*(K+1)).")
    dtype: Optional[str] = Field(None, description="Model dtype (float32 on CPU for exact equality).")
    gpu_memory_utilization: Optional[float] = Field(None, gt=0.0, le=1.0, description="Share of accelerator "
                                                    "memory (on CPU: of host memory).")
    served_model_name: Optional[str] = Field(None, description="Model name clients use.")
    extra_args: tuple[str, ...] = Field((), description="Arguments passed to `vllm serve` untouched (on the "
                                                        "command line: after `--`).")


class RuntimeSpec(_Strict):
    """Everything the runtime needs, validated once."""

    version: int = Field(SPEC_SCHEMA_VERSION, description="Spec schema version.")
    method: Method = Field("ngram", description="Drafting method.")
    target_model: str = Field(description="Target model: a `vspec models` name, a path or a hub id.")
    drafter: Optional[str] = Field(None, description="Draft model or EAGLE head (a `vspec models` name or a path).")
    gamma: int = Field(4, ge=1, le=MAX_GAMMA, description="Maximum K (vLLM's num_speculative_tokens).")
    ngram_min: int = Field(1, ge=1, le=32, description="Smallest n-gram to match (method ngram).")
    ngram_max: int = Field(4, ge=1, le=32, description="Largest n-gram to match (method ngram).")
    adaptive: AdaptiveSettings = AdaptiveSettings()
    relaxed: RelaxedAcceptance = RelaxedAcceptance()
    serving: ServingSettings = ServingSettings()

    @model_validator(mode="after")
    def _check_combinations(self) -> "RuntimeSpec":
        problems = list(_combination_problems(self))
        if problems:
            raise ValueError(problems[0])
        return self

    @property
    def speculating(self) -> bool:
        return self.method != "none"

    @property
    def adaptive_active(self) -> bool:
        return self.speculating and self.adaptive.enabled

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=False)

    @classmethod
    def from_json(cls, text: str) -> "RuntimeSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"runtime spec is not valid JSON: {exc}") from None
        return validate_spec(data)


def _combination_problems(spec: RuntimeSpec):
    if spec.version != SPEC_SCHEMA_VERSION:
        yield f"version: got {spec.version}; this vspec reads spec version {SPEC_SCHEMA_VERSION}"
    if spec.method in METHODS_WITH_DRAFTER and not spec.drafter:
        yield f"drafter: method '{spec.method}' needs a drafter model (a path or a `vspec models` name)"
    if spec.method in ("ngram", "none") and spec.drafter:
        yield f"drafter: method '{spec.method}' takes no drafter model (got '{spec.drafter}')"
    if spec.ngram_min > spec.ngram_max:
        yield f"ngram_min: got {spec.ngram_min}; must be <= ngram_max ({spec.ngram_max})"
    ad = spec.adaptive
    if ad.min_gamma > spec.gamma:
        yield f"adaptive.min_gamma: got {ad.min_gamma}; must be <= gamma ({spec.gamma})"
    if ad.enabled and spec.method == "none":
        yield "adaptive.enabled: adaptive speculation needs a drafting method, not 'none'"
    if ad.enabled and ad.policy == "profile" and not ad.profile:
        yield "adaptive.profile: policy 'profile' needs a profile file (--adaptive-profile PATH)"
    if ad.profile and ad.policy != "profile":
        yield f"adaptive.profile: only used by policy 'profile' (policy is '{ad.policy}')"
    if ad.enabled and ad.policy == "table" and not ad.table:
        yield "adaptive.table: policy 'table' needs a batch-size -> K table"
    if ad.enabled and ad.policy == "sweep" and not ad.sweep_gammas:
        yield "adaptive.sweep_gammas: policy 'sweep' needs the list of K values to cycle through"
    for k in ad.sweep_gammas or ():
        if not 0 <= k <= spec.gamma:
            yield f"adaptive.sweep_gammas: got {k}; need 0 <= K <= gamma ({spec.gamma})"
    if ad.fixed_gamma is not None and ad.fixed_gamma > spec.gamma:
        yield f"adaptive.fixed_gamma: got {ad.fixed_gamma}; must be <= gamma ({spec.gamma})"
    for batch, k in (ad.table or {}).items():
        if batch < 1 or not 0 <= k <= spec.gamma:
            yield f"adaptive.table: entry {batch} -> {k}; need batch >= 1 and 0 <= K <= gamma ({spec.gamma})"
    if spec.relaxed.enabled and spec.method not in METHODS_WITH_DRAFTER:
        yield f"relaxed: relaxed acceptance needs method draft, eagle or eagle3 (got '{spec.method}')"
    if ad.entropy_stop and spec.method not in METHODS_WITH_DRAFTER:
        yield f"adaptive.entropy_stop: confidence stop needs a model drafter (got method '{spec.method}')"


def _describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(exc: ValidationError, source: str = "") -> str:
    """One line: the first problem, naming the field, the bad value and what is allowed."""
    return _format_error(exc.errors()[0], source)


def _format_error(err: Any, source: str) -> str:
    loc = ".".join(str(part) for part in err["loc"])
    prefix = f"{source}: " if source else ""
    if err["type"] == "extra_forbidden":
        return f"{prefix}unknown key '{loc}'"
    if err["type"] == "value_error":
        # Our own combination checks already read "field: got ...; rule".
        return prefix + str(err["msg"]).removeprefix("Value error, ")
    where = f"{loc}: " if loc else ""
    return f"{prefix}{where}got {_describe_input(err.get('input'))}; {err['msg'][0].lower()}{err['msg'][1:]}"


def validate_spec(data: dict[str, Any], source: str = "") -> RuntimeSpec:
    """Validate a plain dict into a RuntimeSpec or raise SpecError with a one-line message."""
    try:
        return RuntimeSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, source)) from None


def layer_problem(data: dict[str, Any], source: str = "") -> Optional[str]:
    """Field-level problems (unknown keys, wrong types, out of range) of one settings layer alone.

    Combination rules (min_gamma <= gamma, ...) are skipped here: they depend on the other layers
    and are judged once after merging. This lets an error name the file that holds the bad key.
    """
    probe = {"target_model": "probe", **data}
    try:
        RuntimeSpec.model_validate(probe)
    except ValidationError as exc:
        field_errors = [err for err in exc.errors() if err["type"] != "value_error"]
        if field_errors:
            return _format_error(field_errors[0], source)
    return None


def spec_field_names() -> dict[str, list[str]]:
    """Allowed keys per section, for help texts and the preset schema docs."""
    return {
        "": [name for name in RuntimeSpec.model_fields if name not in ("adaptive", "relaxed", "serving")],
        "adaptive": list(AdaptiveSettings.model_fields),
        "relaxed": list(RelaxedAcceptance.model_fields),
        "serving": list(ServingSettings.model_fields),
    }
