"""Paired ratios with 95% intervals, from rounds that ran the same prompts back to back.

In the interleaved bench every policy runs each round's prompts inside warm engines, one policy
after another, so a round gives one paired sample of the ratio between two policies: whatever
changed slowly (the machine's load, the engine run) is common to both and cancels in the ratio.

Method: a paired t interval on the log ratios, exp'd back. Log, because throughput noise is
multiplicative and a ratio's log is symmetric (1.05x and 1/1.05x are equally far from 1); t rather
than a bootstrap over rounds because a cell has 5-20 pairs, where bootstrap percentile intervals
are too narrow (they cover less than 95%), while the t interval is exact for normal log ratios and
robust enough at these sizes. Pairs from different repeats are pooled (each repeat is a fresh set
of engines; the pairing is within a round, so the interval reflects between-round and
between-engine variation of the ratio alike).

``rounds_for(half_width)`` says how many pairs the observed spread would need for a +-2% interval.
A target is *met* when the whole interval is at or above it, *missed* when the whole interval is
below, and *not resolved* when the interval straddles it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Optional

Z95 = 1.96
# Two-sided 97.5% quantiles of Student's t by degrees of freedom (1..30); beyond 30 the normal's.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        return math.inf
    return _T975[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T975) else Z95


Key = tuple[int, int]  # (repeat, round)


def paired_ratio(values: dict[Key, float], reference: dict[Key, float]) -> Optional[dict[str, Any]]:
    """Geometric-mean ratio values/reference over the rounds both ran, with its 95% interval."""
    return log_ratio_interval(paired_logs(values, reference))


def paired_logs(values: dict[Key, float], reference: dict[Key, float]) -> list[float]:
    """log(values/reference) for every round both ran, in round order."""
    keys = sorted(k for k in values if k in reference and values[k] > 0 and reference[k] > 0)
    return [math.log(values[k] / reference[k]) for k in keys]


def log_ratio_interval(logs: list[float]) -> Optional[dict[str, Any]]:
    """The geometric-mean ratio of paired samples given as log ratios, with its 95% t interval."""
    if not logs:
        return None
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(mean), "low": None, "high": None, "pairs": 1, "sd_log": None, "pairs_for_2pct": None}
    sd = statistics.stdev(logs)
    half = t975(len(logs) - 1) * sd / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half),
            "pairs": len(logs), "sd_log": sd, "pairs_for_2pct": rounds_for(sd, 0.02)}


def stratified_interval(strata: list[list[float]]) -> Optional[dict[str, Any]]:
    """One ratio over several cells at once: the mean log ratio of all their pairs, with a 95% interval.

    Each cell (stratum) is its own set of paired rounds, and cells differ in their true ratio (copy
    gains where chat does not), so the pairs are not one sample: the estimate is the pairs-weighted
    mean of the cells' means (which is the plain mean over all pairs), and its variance adds up each
    cell's own sampling variance, weight^2 * sd^2 / n. The differences *between* cells are part of
    what is measured (this set of cells), not noise, so they do not widen the interval; the degrees
    of freedom come from Welch-Satterthwaite. Cells with fewer than two pairs have no spread to add
    and are left out.
    """
    usable = [logs for logs in strata if len(logs) >= 2]
    total = sum(len(logs) for logs in usable)
    if not total:
        return None
    mean = sum(math.fsum(logs) for logs in usable) / total
    parts = [(len(logs) / total) ** 2 * statistics.variance(logs) / len(logs) for logs in usable]
    variance = math.fsum(parts)
    if variance <= 0:
        return {"ratio": math.exp(mean), "low": math.exp(mean), "high": math.exp(mean), "pairs": total,
                "cells": len(usable)}
    df = variance ** 2 / math.fsum(part ** 2 / (len(logs) - 1) for part, logs in zip(parts, usable))
    half = t975(int(df)) * math.sqrt(variance)
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "pairs": total,
            "cells": len(usable)}


def rounds_for(sd_log: float, half_width: float) -> int:
    """Pairs needed for a 95% interval of +-``half_width`` (relative) at this spread of log ratios."""
    if sd_log <= 0:
        return 2
    return max(2, math.ceil((Z95 * sd_log / math.log1p(half_width)) ** 2))


def verdict(interval: Optional[dict[str, Any]], threshold: float) -> Optional[str]:
    """'met', 'missed' or 'not resolved' for ``ratio >= threshold``; None when nothing was measured."""
    if interval is None:
        return None
    low, high = interval.get("low"), interval.get("high")
    if low is None or high is None:
        return "not resolved"
    if low >= threshold:
        return "met"
    if high < threshold:
        return "missed"
    return "not resolved"


def geometric_mean(values: dict[Key, float]) -> Optional[float]:
    positive = [v for v in values.values() if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in positive)) if positive else None
