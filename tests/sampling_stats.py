"""Two-sample statistics for sampled outputs: is speculation's output distribution the target's?

Two measures, each with a stated false-alarm rate when both samples come from the same distribution
(independent seeds on each side):
- per early position, a chi-square test of homogeneity on the generated tokens (tokens seen fewer
  than ``MIN_COUNT`` times in both samples together are pooled into one "rare" class, so expected
  counts stay large enough for the chi-square approximation);
- the mean target log-probability per generated token, compared with a Welch z statistic on the
  per-sequence means (the sequences are independent; tokens within one are not).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

MIN_COUNT = 5
RARE = -1
ALPHA = 1e-4  # false alarms about 1e-4 per chi-square test
Z_LIMIT = 4.4  # standard errors of the log-probability gap: two-sided false alarms about 1e-5
POSITIONS = (2, 3, 4, 5)  # position 1 is sampled from the prefill, before any draft exists


def tokens_at(outputs: list[dict], position: int) -> list[int]:
    """The token each output generated at ``position`` (1-based), for outputs that reached it."""
    return [out["token_ids"][position - 1] for out in outputs if len(out["token_ids"]) >= position]


def homogeneity_p_value(first: list[int], second: list[int]) -> float:
    """Chi-square test that two samples of tokens come from one distribution; 1.0 when nothing varies."""
    from scipy.stats import chi2_contingency

    together = Counter(first) + Counter(second)
    common = {token for token, count in together.items() if count >= MIN_COUNT}

    def table(sample: list[int]) -> Counter:
        return Counter(token if token in common else RARE for token in sample)

    a, b = table(first), table(second)
    classes = sorted(set(a) | set(b))
    if len(classes) < 2:
        return 1.0
    return float(chi2_contingency([[a[c] for c in classes], [b[c] for c in classes]])[1])


def mean_logprob(outputs: list[dict]) -> list[float]:
    """Per sequence: the mean target log-probability of its generated tokens."""
    return [sum(out["logprobs"]) / len(out["logprobs"]) for out in outputs if out["logprobs"]]


def logprob_gap(first: list[dict], second: list[dict]) -> tuple[float, float]:
    """(difference of the mean per-sequence log-probabilities, its standard error)."""
    a, b = mean_logprob(first), mean_logprob(second)
    gap = statistics.fmean(a) - statistics.fmean(b)
    return gap, math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))


def distribution_problems(spec_outputs: list[dict], reference_outputs: list[dict]) -> list[str]:
    """What the two-sample tests reject (empty when speculation looks like the target)."""
    problems = []
    for position in POSITIONS:
        p_value = homogeneity_p_value(tokens_at(spec_outputs, position), tokens_at(reference_outputs, position))
        if p_value < ALPHA:
            problems.append(f"position {position}: token distributions differ (chi-square p={p_value:.2g})")
    gap, standard_error = logprob_gap(spec_outputs, reference_outputs)
    if abs(gap) > Z_LIMIT * standard_error:
        problems.append(f"mean target log-probability per token differs by {gap:+.3f} (+-{standard_error:.3f} s.e.)")
    return problems
