"""Paired significance tests between two systems' per-query values.

The tables mark differences with the **paired two-sided randomization
(permutation) test**: under the null hypothesis the two systems are
exchangeable on every query, so each per-query difference keeps or flips its
sign with probability 1/2; the p-value is the share of sign assignments whose
mean difference is at least as far from zero as the observed one. It makes no
normality assumption (per-query RR and nDCG are far from normal). The paired
t-test is provided for comparison with papers that use it.

Beside each p-value: a **paired bootstrap confidence interval** of the mean
difference (queries resampled with replacement, the percentile interval), and,
over the tests of one table, **Holm's step-down correction** (it controls the
family-wise error rate under any dependence between the tests, which share
queries and systems).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Mapping

import numpy as np


def paired_values(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Two systems' per-query values as aligned arrays; both must cover the same queries."""
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b))[:5], sorted(set(b) - set(a))[:5]
        raise ValueError(f"the systems were evaluated on different queries (only in first: {only_a}, "
                         f"only in second: {only_b}); evaluate both on the same qrels")
    if not a:
        raise ValueError("no per-query values to compare")
    qids = sorted(a)
    return np.array([a[q] for q in qids], dtype=np.float64), np.array([b[q] for q in qids], dtype=np.float64)


def randomization_test(a: Mapping[str, float], b: Mapping[str, float], trials: int = 10_000,
                       seed: int = 42, chunk: int = 1_000) -> float:
    """Two-sided p-value of the paired randomization test of mean(a) != mean(b).

    ``p = (1 + #{trials with |mean of sign-flipped differences| >= |observed|}) / (1 + trials)``,
    which is never 0 and is exactly 1 when the systems agree on every query.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    x, y = paired_values(a, b)
    differences = x - y
    observed = abs(differences.mean())
    # Tolerance so that sums of the same numbers in another order still count as "as extreme".
    tolerance = 1e-12 * max(1.0, float(np.abs(differences).max()))
    rng = np.random.default_rng(seed)
    at_least_as_extreme = 0
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        signs = rng.integers(0, 2, size=(n, len(differences)), dtype=np.int8) * 2 - 1
        means = np.abs(signs @ differences) / len(differences)
        at_least_as_extreme += int(np.count_nonzero(means >= observed - tolerance))
    return (1 + at_least_as_extreme) / (1 + trials)


def paired_t_test(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Two-sided p-value of the paired t-test (scipy's ``ttest_rel``); 1.0 when all differences are 0."""
    from scipy import stats

    x, y = paired_values(a, b)
    if np.all(x == y):
        return 1.0  # scipy returns NaN here: no variance, and no evidence of a difference
    return float(stats.ttest_rel(x, y).pvalue)


# Two-sided test at alpha = 0.05 with power 0.8: z_0.975 + z_0.80 = 1.95996 + 0.84162.
ALPHA = 0.05
POWER = 0.8
_MDE_Z = NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)


# A spread of per-query differences below this share of their scale is float noise, not spread.
_SAME = 1e-9


def minimum_detectable_effect(differences: list[float]) -> float | None:
    """The smallest mean difference a paired test on these queries detects at p<0.05 with 80% power.

    ``MDE = (z_0.975 + z_0.8) * sd(d) / sqrt(n)`` over the per-query
    differences ``d`` (sample standard deviation): the normal approximation
    of the paired test's power, which the randomization test follows closely
    at the test-set sizes of the tables. None below two queries, and None
    when every difference is the same (two identical systems, or a judge that
    labels every pair alike): with no spread the approximation would call any
    difference detectable, and the sample says nothing about the test's power.
    """
    n = len(differences)
    if n < 2:
        return None
    mean = math.fsum(differences) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in differences) / (n - 1))
    # "The same" up to float noise: differences equal on one machine differ in their last bits on another.
    scale = max(1.0, max(abs(d) for d in differences))
    return _MDE_Z * sd / math.sqrt(n) if sd > _SAME * scale else None


def paired_confidence_interval(differences, level: float = 0.95, resamples: int = 10_000,
                               seed: int = 0, chunk: int = 1_000) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of per-query ``differences``; None below two queries.

    Each resample draws ``len(differences)`` queries with replacement (the paired design: a query's
    two values stay together); the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the resampled means. All differences equal give the point ``(d, d)``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    values = np.asarray(differences, dtype=np.float64)
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        means[start:start + n] = values[rng.integers(0, len(values), size=(n, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    With the ``m`` p-values sorted ascending, the ``i``-th (from 0) becomes ``min(1, (m - i) * p)``,
    made non-decreasing along the order; a test is rejected at level alpha when its adjusted
    value is at most alpha, which keeps the chance of any false rejection among the ``m`` at most alpha.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for position, index in enumerate(order):
        running = max(running, min(1.0, (m - position) * p_values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """A paired test of two systems over the queries both were evaluated on; ``ci`` is the 95%
    bootstrap interval of the mean difference (:func:`paired_confidence_interval`)."""

    p_value: float | None
    n_queries: int
    mde: float | None
    note: str | None
    ci: tuple[float, float] | None = None


def compare_paired(with_values: Mapping[str, float], without_values: Mapping[str, float],
                   permutations: int = 10000, seed: int = 0) -> Comparison:
    """Randomization-test p-value, MDE and 95% bootstrap interval (in the values' unit) of
    ``with - without`` per query.

    The test is :func:`randomization_test`; the interval resamples ``permutations`` times with ``seed``.
    Queries present on one side only are left out, and the note says how many.
    """
    shared = sorted(set(with_values) & set(without_values))
    note = None
    dropped = len(set(with_values) ^ set(without_values))
    if dropped:
        note = f"{dropped} queries evaluated for one system only were left out of the test"
    if len(shared) < 2:
        return Comparison(None, len(shared), None, "fewer than 2 shared queries: no test")
    p_value = randomization_test({qid: with_values[qid] for qid in shared},
                                 {qid: without_values[qid] for qid in shared}, trials=permutations, seed=seed)
    differences = [with_values[qid] - without_values[qid] for qid in shared]
    ci = paired_confidence_interval(differences, resamples=permutations, seed=seed)
    return Comparison(p_value, len(shared), minimum_detectable_effect(differences), note, ci)
