"""Paired significance tests between two systems' per-query values.

The tables mark differences with the **paired two-sided randomization
(permutation) test**: under the null hypothesis the two systems are
exchangeable on every query, so each per-query difference keeps or flips its
sign with probability 1/2; the p-value is the share of sign assignments whose
mean difference is at least as far from zero as the observed one. It makes no
normality assumption (per-query RR and nDCG are far from normal). The paired
t-test is provided for comparison with papers that use it.
"""

from __future__ import annotations

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
