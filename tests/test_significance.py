"""Paired significance tests: cases whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from qac.evaluation.significance import paired_t_test, randomization_test


def as_per_query(values):
    return {f"q{i}": float(v) for i, v in enumerate(values)}


def test_identical_systems_have_p_one():
    a = as_per_query(np.random.default_rng(0).random(50))
    assert randomization_test(a, a, trials=2000) == 1.0
    assert paired_t_test(a, a) == 1.0


def test_large_consistent_difference_has_the_smallest_possible_p():
    rng = np.random.default_rng(1)
    base = rng.random(200)
    a, b = as_per_query(base + 0.2 + rng.normal(0, 0.01, 200)), as_per_query(base)
    # No sign assignment other than the observed one (and its mirror) is as extreme.
    assert randomization_test(a, b, trials=5000) == pytest.approx(1 / 5001)
    assert paired_t_test(a, b) < 1e-10


def test_exact_p_value_on_a_small_case():
    # Differences (1, 1, 1): 8 equally likely sign patterns, 2 reach |mean| = 1, so p -> 0.25.
    a, b = as_per_query([1, 1, 1]), as_per_query([0, 0, 0])
    assert randomization_test(a, b, trials=40_000, seed=3) == pytest.approx(0.25, abs=0.01)


def test_randomization_is_seeded_and_symmetric():
    rng = np.random.default_rng(2)
    a, b = as_per_query(rng.random(30)), as_per_query(rng.random(30))
    assert randomization_test(a, b, seed=7, trials=3000) == randomization_test(a, b, seed=7, trials=3000)
    assert randomization_test(a, b, seed=7, trials=3000) == randomization_test(b, a, seed=7, trials=3000)


def test_t_test_matches_scipy():
    rng = np.random.default_rng(4)
    x, y = rng.random(40), rng.random(40) + 0.05
    assert paired_t_test(as_per_query(x), as_per_query(y)) == pytest.approx(stats.ttest_rel(x, y).pvalue)


def test_different_query_sets_are_rejected():
    with pytest.raises(ValueError, match="different queries"):
        randomization_test({"q1": 1.0}, {"q2": 1.0})
