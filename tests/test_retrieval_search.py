"""FAISS exact search against numpy brute force; runs from search results."""

from __future__ import annotations

import numpy as np
import pytest

from qac.retrieval.search import dense_search, search, to_run


def test_search_equals_numpy_brute_force():
    rng = np.random.default_rng(0)
    passages = rng.normal(size=(500, 16)).astype(np.float32)
    queries = rng.normal(size=(37, 16)).astype(np.float32)
    scores, indices = search(queries, passages, k=20, batch_size=8)   # several query batches
    exact = queries @ passages.T
    expected = np.argsort(-exact, axis=1)[:, :20]
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(exact, expected, axis=1), rtol=1e-5, atol=1e-5)


def test_k_larger_than_corpus_returns_every_passage():
    passages = np.eye(3, dtype=np.float32)
    scores, indices = search(np.array([[0.0, 2.0, 1.0]], dtype=np.float32), passages, k=1000)
    assert indices.tolist() == [[1, 2, 0]]
    assert scores.tolist() == [[2.0, 1.0, 0.0]]


def test_dense_search_builds_a_run():
    passages = np.eye(3, dtype=np.float32)
    run = dense_search(["q"], np.array([[0.0, 2.0, 1.0]]), ["a", "b", "c"], passages, k=2)
    assert run == {"q": {"b": 2.0, "c": 1.0}}


def test_to_run_skips_missing_results():
    assert to_run(["q"], ["a"], np.array([[1.0, -np.inf]]), np.array([[0, -1]])) == {"q": {"a": 1.0}}


def test_dimension_mismatch_is_an_error():
    with pytest.raises(ValueError, match="dimension"):
        search(np.zeros((1, 4)), np.zeros((2, 3)))
