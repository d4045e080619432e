"""Fit the step-latency model of a ``vspec-profile/1`` profile from measured samples.

**Per component, not per K.** Each stable step is modelled as

    T_step = target(ctx, n) + K * drafter(ctx, B) + overhead(K)
    target(ctx, n) = alpha*ctx + c*n + delta        (n = tokens verified, ctx = context summed)
    drafter(ctx, B) = alpha_d*ctx + c_d*B           (model drafters only; ngram: none)

and all coefficients are fitted together by one non-negative least-squares solve
(``scipy.optimize.nnls``) on the columns [ctx, n, 1, K*ctx, K*B, one indicator per K]. Why not an
independent [ctx, n, 1] fit per K:

* It is the profile format (latency_profile.py) the policy reads: target and drafter components
  plus a per-K overhead. A per-K fit has no place in that contract and cannot predict a batch
  size or K it was not measured at, which is what the policy asks of it every decision.
* Sharing alpha and c across K uses every sample for them. A per-K fit with the usual two or three
  measured batch sizes sees n take two or three values per K, so its c rests on a few clusters
  and its held-out error is worse; the shared model has 3 + (K values - 1) coefficients in place
  of 3 per K.
* The per-K indicator (relative to the smallest K measured, whose overhead is folded into delta)
  takes what the forward model does not describe: the n-gram proposer's host-side search, the
  rejection sampler, bookkeeping. For model drafters it also holds their per-forward fixed cost,
  which is collinear with it (K * delta_d is a function of K), so the drafter's ``delta`` is
  written as 0 and ``overhead_ms_per_k`` carries K * delta_d.

Rows are weighted by 1/measured latency (least squares on relative error), since the figure of
merit is the percentage error and a 300 ms batch-8 step should not outweigh a 60 ms batch-1 one.
The solve is repeated up to three times dropping training samples whose relative residual is far
outside the rest (4 scaled MADs, at most 20% of them): on a shared host a step that waited for
another process is not a property of this model, and squared error lets a few of them move it.
Every fifth usable sample is held out of the fit and never trimmed; the median absolute
percentage error on those is the figure reported.

Size: just over 400 lines, a tenth of them this explanation; the design matrix, the trimmed solve
and the held-out error are one method and read best together.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from vspec_cli._errors import PreconditionError, UserInputError
from vspec_cli.profiling.samples import Sample, usable
from vspec_runtime.control.latency_profile import PROFILE_SCHEMA, ComponentLatency, LatencyProfile

HOLDOUT_EVERY = 5
TRIM_ROUNDS = 3
TRIM_MADS = 4.0
TRIM_FLOOR = 0.05  # never trim a sample within 5% of the fit
TRIM_MAX_SHARE = 0.2
MIN_SAMPLES_PER_COEFFICIENT = 2
TABLE_MIN_SAMPLES = 3  # per (batch, K) for the measured batch-size -> K prior


@dataclass(frozen=True)
class Column:
    name: str  # "target.alpha", "drafter.c", "overhead.3", ...
    label: str  # what the column holds, for messages


@dataclass(frozen=True)
class PointSummary:
    """Measured and predicted latency at one (batch size, K)."""

    batch_size: int
    gamma: int
    samples: int
    measured_ms: float  # median
    predicted_ms: float  # median
    error: float  # median absolute percentage error (fraction)
    tokens_per_s: float  # committed tokens / measured time


@dataclass
class FitResult:
    profile: LatencyProfile
    coefficients: dict[str, float]
    samples_total: int
    samples_usable: int
    samples_train: int
    samples_heldout: int
    samples_trimmed: int
    heldout_error: Optional[float]  # median absolute percentage error (fraction); None without hold-out
    train_error: float
    heldout_error_by_gamma: dict[int, float]
    heldout_error_by_batch: dict[int, float]
    points: list[PointSummary]
    table: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What goes into the profile's meta["fit"] and the --json output."""
        return {
            "model": "T_step = target(ctx, n) + K*drafter(ctx, B) + overhead(K); NNLS, rows weighted 1/T",
            "samples": {"total": self.samples_total, "usable": self.samples_usable, "train": self.samples_train,
                        "heldout": self.samples_heldout, "trimmed": self.samples_trimmed},
            "holdout": f"every {HOLDOUT_EVERY}th usable sample",
            "heldout_median_ape": _round(self.heldout_error),
            "train_median_ape": _round(self.train_error),
            "heldout_median_ape_by_k": {str(k): _round(v) for k, v in sorted(self.heldout_error_by_gamma.items())},
            "heldout_median_ape_by_batch": {str(b): _round(v) for b, v in sorted(self.heldout_error_by_batch.items())},
            "coefficients": {name: _round(value, 9) for name, value in self.coefficients.items()},
            "points": [
                {"batch_size": p.batch_size, "k": p.gamma, "samples": p.samples,
                 "measured_ms": _round(p.measured_ms, 3), "predicted_ms": _round(p.predicted_ms, 3),
                 "median_ape": _round(p.error), "tokens_per_s": _round(p.tokens_per_s, 2)}
                for p in self.points
            ],
        }


def _round(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(float(value), digits)


# --- the design ---------------------------------------------------------------------------------


def columns_for(gammas: Sequence[int], model_drafter: bool) -> list[Column]:
    columns = [
        Column("target.alpha", "context tokens"),
        Column("target.c", "batched tokens"),
        Column("target.delta", "a constant per step"),
    ]
    if model_drafter:
        columns += [Column("drafter.alpha", "K x context tokens"), Column("drafter.c", "K x batch size")]
    baseline = min(gammas)
    columns += [Column(f"overhead.{k}", f"the indicator of K={k}") for k in sorted(set(gammas)) if k != baseline]
    return columns


def design_row(sample: Sample, columns: Sequence[Column]) -> list[float]:
    row = []
    for column in columns:
        name = column.name
        if name == "target.alpha":
            row.append(float(sample.context_tokens))
        elif name == "target.c":
            row.append(float(sample.batched_tokens))
        elif name == "target.delta":
            row.append(1.0)
        elif name == "drafter.alpha":
            row.append(float(sample.gamma * sample.context_tokens))
        elif name == "drafter.c":
            row.append(float(sample.gamma * sample.batch_size))
        else:
            row.append(1.0 if sample.gamma == int(name.split(".", 1)[1]) else 0.0)
    return row


def split_heldout(samples: Sequence[Sample], every: int = HOLDOUT_EVERY) -> tuple[list[Sample], list[Sample]]:
    """(train, heldout): every ``every``-th sample held out (0 or 1: none)."""
    if every <= 1:
        return list(samples), []
    train = [s for i, s in enumerate(samples) if i % every != every - 1]
    heldout = [s for i, s in enumerate(samples) if i % every == every - 1]
    return train, heldout


# --- the fit ------------------------------------------------------------------------------------


def fit_samples(
    samples: Sequence[Sample],
    *,
    model_drafter: bool,
    max_gamma: Optional[int] = None,
    holdout_every: int = HOLDOUT_EVERY,
    with_table: bool = True,
    table_batches: Optional[Sequence[int]] = None,
    meta: Optional[dict[str, Any]] = None,
    source: str = "samples",
) -> FitResult:
    """Fit the profile; UserInputError (one line) when the samples cannot determine it."""
    _require_scipy()
    import numpy as np

    if max_gamma is not None and max_gamma < 0:
        raise UserInputError(f"--max-gamma: got {max_gamma}; must be >= 0")
    candidates = usable(list(samples))
    if max_gamma is not None:
        candidates = [s for s in candidates if s.gamma <= max_gamma]
    if not candidates:
        raise UserInputError(
            f"{source}: no stable decode steps to fit (of {len(samples)} samples)",
            hint="collect with longer phases (--steps-per-point) so every K runs several steps in a row",
        )
    gammas = sorted({s.gamma for s in candidates})
    max_gamma = max(gammas) if max_gamma is None else max_gamma
    columns = columns_for(gammas, model_drafter)
    train, heldout = split_heldout(candidates, holdout_every)
    needed = MIN_SAMPLES_PER_COEFFICIENT * len(columns)
    if len(train) < needed:
        raise UserInputError(
            f"{source}: {len(train)} stable samples to fit {len(columns)} coefficients; need at least {needed}",
            hint="collect longer phases (--steps-per-point) or fewer K values",
        )
    design = np.array([design_row(s, columns) for s in train])
    measured = np.array([s.interval_ms for s in train])
    _check_rank(design, columns, train, source)

    keep = np.ones(len(train), dtype=bool)
    coef = _weighted_nnls(design, measured)
    for _ in range(TRIM_ROUNDS):
        relative = (design @ coef - measured) / measured
        centre = float(np.median(relative[keep]))
        spread = 1.4826 * float(np.median(np.abs(relative[keep] - centre)))
        limit = max(TRIM_MADS * spread, TRIM_FLOOR)
        distance = np.abs(relative - centre)
        if np.count_nonzero(distance > limit) > TRIM_MAX_SHARE * len(train):
            limit = float(np.quantile(distance, 1.0 - TRIM_MAX_SHARE))
        new_keep = distance <= limit
        if np.array_equal(new_keep, keep) or np.linalg.matrix_rank(_normalised(design[new_keep])) < len(columns):
            break
        keep = new_keep
        coef = _weighted_nnls(design[keep], measured[keep])

    values = {column.name: float(value) for column, value in zip(columns, coef)}
    table = measured_table(candidates, table_batches) if with_table else {}
    profile = _profile_from(values, gammas, max_gamma, model_drafter, table, meta or {})

    def predict(sample: Sample) -> float:
        return float(np.dot(design_row(sample, columns), coef))

    def ape(sample: Sample) -> float:
        return abs(predict(sample) - sample.interval_ms) / sample.interval_ms

    train_error = statistics.median(ape(s) for s in train)
    heldout_error = statistics.median(ape(s) for s in heldout) if heldout else None
    return FitResult(
        profile=profile,
        coefficients=values,
        samples_total=len(samples),
        samples_usable=len(candidates),
        samples_train=len(train),
        samples_heldout=len(heldout),
        samples_trimmed=int(len(train) - np.count_nonzero(keep)),
        heldout_error=heldout_error,
        train_error=train_error,
        heldout_error_by_gamma=_grouped_error(heldout, ape, key=lambda s: s.gamma),
        heldout_error_by_batch=_grouped_error(heldout, ape, key=lambda s: s.batch_size),
        points=point_summaries(candidates, predict),
        table=table,
    )


def _require_scipy() -> None:
    try:
        import numpy  # noqa: F401
        import scipy.optimize  # noqa: F401
    except ImportError as exc:
        raise PreconditionError(f"fitting a profile needs numpy and scipy ({exc.name} is missing)",
                                hint="pip install 'vspec[bench]'  (or: pip install scipy)") from None


def _normalised(design):
    import numpy as np

    norms = np.linalg.norm(design, axis=0)
    norms[norms == 0.0] = 1.0
    return design / norms


def _weighted_nnls(design, measured):
    """NNLS on rows scaled by 1/measured (relative error), columns scaled to unit norm."""
    import numpy as np
    from scipy.optimize import nnls

    weighted = design / measured[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    norms[norms == 0.0] = 1.0
    solution, _residual = nnls(weighted / norms, np.ones(len(measured)), maxiter=50 * design.shape[1])
    return solution / norms


def _check_rank(design, columns: Sequence[Column], train: Sequence[Sample], source: str) -> None:
    import numpy as np

    scaled = _normalised(design)
    singular = np.linalg.svd(scaled, compute_uv=False)
    if singular[-1] > 1e-9 * singular[0]:
        return
    contexts = {s.context_tokens for s in train}
    batched = {s.batched_tokens for s in train}
    hint = "collect at two or more batch sizes and several K values (vspec profile collect --batches 1,8)"
    if len(contexts) == 1 and len(batched) == 1:
        raise UserInputError(
            f"{source}: rank-deficient: every sample has context {next(iter(contexts))} and batched tokens "
            f"{next(iter(batched))}, so alpha, c and delta cannot be told apart", hint=hint)
    if len(batched) == 1:
        raise UserInputError(
            f"{source}: rank-deficient: every sample has batched tokens {next(iter(batched))}, so c cannot be "
            "told apart from delta", hint=hint)
    if len(contexts) == 1:
        raise UserInputError(
            f"{source}: rank-deficient: every sample has context {next(iter(contexts))}, so alpha cannot be "
            "told apart from delta", hint=hint)
    if len({s.batch_size for s in train}) == 1 and all(
            len({s.batched_tokens for s in train if s.gamma == k}) == 1 for k in {s.gamma for s in train}):
        raise UserInputError(
            f"{source}: rank-deficient: one batch size, so batched tokens follow K exactly and c cannot be "
            "told apart from the per-K overheads", hint=hint)
    _, _, vt = np.linalg.svd(scaled)
    null = np.abs(vt[-1])
    involved = [columns[i] for i in np.argsort(-null) if null[i] > 0.1 * null.max()]
    names = ", ".join(f"{c.name} ({c.label})" for c in involved)
    raise UserInputError(f"{source}: rank-deficient: the samples cannot separate {names}", hint=hint)


def _profile_from(values: dict[str, float], gammas: Sequence[int], max_gamma: int, model_drafter: bool,
                  table: dict[int, int], meta: dict[str, Any]) -> LatencyProfile:
    target = ComponentLatency(values["target.alpha"], values["target.c"], values["target.delta"])
    drafter = ComponentLatency(values["drafter.alpha"], values["drafter.c"], 0.0) if model_drafter else None
    baseline = min(gammas)
    overheads = {k: (0.0 if k == baseline else values[f"overhead.{k}"]) for k in gammas if k <= max_gamma}
    document = {
        "schema": PROFILE_SCHEMA,
        "target": target.to_dict(),
        "drafter": None if drafter is None else drafter.to_dict(),
        "overhead_ms_per_k": {str(k): v for k, v in overheads.items()},
        "max_gamma": max_gamma,
        "meta": meta,
    }
    if table:
        document["table"] = {str(batch): min(k, max_gamma) for batch, k in sorted(table.items())}
    return LatencyProfile.from_dict(_rounded(document))  # the written document passes its own validation


def _rounded(document: dict[str, Any]) -> dict[str, Any]:
    def fix(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.6g}") if value else 0.0
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return {key: (fix(value) if key != "meta" else value) for key, value in document.items()}


def _grouped_error(samples: Sequence[Sample], ape, key) -> dict[int, float]:
    groups: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        groups[key(sample)].append(ape(sample))
    return {group: statistics.median(errors) for group, errors in sorted(groups.items())}


def point_summaries(samples: Sequence[Sample], predict) -> list[PointSummary]:
    groups: dict[tuple[int, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[(sample.batch_size, sample.gamma)].append(sample)
    points = []
    for (batch, gamma), group in sorted(groups.items()):
        measured = [s.interval_ms for s in group]
        predicted = [predict(s) for s in group]
        errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
        points.append(PointSummary(
            batch_size=batch, gamma=gamma, samples=len(group),
            measured_ms=statistics.median(measured), predicted_ms=statistics.median(predicted),
            error=statistics.median(errors),
            tokens_per_s=1000.0 * sum(s.committed for s in group) / sum(measured),
        ))
    return points


def measured_table(samples: Sequence[Sample], batches: Optional[Sequence[int]] = None) -> dict[int, int]:
    """Batch size -> the K with the best measured goodput, for batch sizes measured at every K.

    A prior for the profile policy before it has acceptance data; it reflects the acceptance of
    the workload the collect run used, which the profile's meta records. ``batches``: the batch
    sizes the run asked for. The smaller batches of a phase's draining tail hold only the requests
    that happened to finish last, so their goodput says more about those requests than about K.
    """
    gammas = {s.gamma for s in samples}
    if len(gammas) < 2:
        return {}
    groups: dict[int, dict[int, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        groups[sample.batch_size][sample.gamma].append(sample)
    table = {}
    for batch, by_gamma in sorted(groups.items()):
        if batches is not None and batch not in batches:
            continue
        if set(by_gamma) != gammas or min(len(v) for v in by_gamma.values()) < TABLE_MIN_SAMPLES:
            continue  # a draining tail, not a measured batch size
        goodput = {k: sum(s.committed for s in v) / sum(s.interval_ms for s in v) for k, v in by_gamma.items()}
        if all(math.isfinite(g) and g > 0 for g in goodput.values()):
            table[batch] = max(sorted(goodput), key=lambda k: goodput[k])
    return table


def profile_document(result: FitResult, meta: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The JSON document to write: the fitted profile, its provenance and the fit's report in meta."""
    document = result.profile.to_dict()
    document["meta"] = {**document.get("meta", {}), **(meta or {}), "fit": result.summary()}
    LatencyProfile.from_dict(document)  # what we write must load
    return document


def predict_sample(profile: LatencyProfile, sample: Sample) -> float:
    """The profile's step latency for a measured sample, with the tokens that step really verified."""
    drafting = 0.0
    if sample.gamma and profile.drafter is not None:
        drafting = sample.gamma * profile.drafter.forward_ms(sample.context_tokens, sample.batch_size)
    verification = profile.target.forward_ms(sample.context_tokens, sample.batched_tokens)
    return drafting + verification + profile.overhead_ms(sample.gamma)


def evaluate(profile: LatencyProfile, samples: Sequence[Sample], holdout_every: int = HOLDOUT_EVERY) -> dict[str, Any]:
    """Per-point summaries and the held-out error of ``profile`` on ``samples`` (as `profile show` reports)."""
    candidates = [s for s in usable(list(samples)) if s.gamma <= profile.max_gamma]
    _, heldout = split_heldout(candidates, holdout_every)

    def ape(sample: Sample) -> float:
        return abs(predict_sample(profile, sample) - sample.interval_ms) / sample.interval_ms

    return {
        "points": point_summaries(candidates, lambda s: predict_sample(profile, s)),
        "heldout_error": statistics.median(ape(s) for s in heldout) if heldout else None,
        "all_error": statistics.median(ape(s) for s in candidates) if candidates else None,
        "samples_usable": len(candidates),
    }
