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


def test_torch_search_equals_faiss_and_the_reference_on_distinct_scores():
    from qac.retrieval.search import search_reference, torch_search

    rng = np.random.default_rng(1)
    passages = rng.normal(size=(400, 16)).astype(np.float32)
    queries = rng.normal(size=(23, 16)).astype(np.float32)
    faiss_scores, faiss_indices = search(queries, passages, k=30)
    scores, indices = torch_search(queries, passages, k=30, query_block=7, passage_block=50)
    reference_scores, reference_indices = search_reference(queries, passages, k=30)
    np.testing.assert_array_equal(indices, faiss_indices)
    np.testing.assert_array_equal(indices, reference_indices)
    # float32 products summed in another order: the same to float32 rounding of the scores' size
    np.testing.assert_allclose(scores, faiss_scores, rtol=0, atol=16 * np.finfo(np.float32).eps * 16)


def test_torch_search_breaks_ties_as_trec_eval_does():
    """Score descending, then document id descending, also where ties straddle the k-th place."""
    from qac.retrieval.search import search_reference, tie_ranks, torch_search

    rng = np.random.default_rng(2)
    # small integers: every product is exact, and many scores tie
    passages = rng.integers(-2, 3, size=(300, 6)).astype(np.float32)
    queries = rng.integers(-2, 3, size=(40, 6)).astype(np.float32)
    doc_ids = [f"doc{rng.integers(0, 10**6):06d}-{i}" for i in range(len(passages))]
    ranks = tie_ranks(doc_ids)
    scores, indices = torch_search(queries, passages, k=25, ranks=ranks, query_block=16, passage_block=40)
    reference_scores, reference_indices = search_reference(queries, passages, k=25, ranks=ranks)
    np.testing.assert_array_equal(indices, reference_indices)
    np.testing.assert_array_equal(scores, reference_scores)
    for row, query in zip(indices, queries):
        exact = passages @ query
        kth = exact[row[-1]]
        assert (exact > kth).sum() < 25 < (exact >= kth).sum() or (exact >= kth).sum() == 25
        keys = [(exact[i], doc_ids[i]) for i in row]
        assert keys == sorted(keys, reverse=True)            # the order trec_eval reads a run in
        outside = [doc_ids[i] for i in np.flatnonzero(exact == kth) if i not in set(row.tolist())]
        inside = [doc_ids[i] for i in row if exact[i] == kth]
        assert all(o < min(inside) for o in outside)         # the boundary keeps the highest ids


def test_the_stages_search_on_the_gpu_path_where_cuda_is_present(monkeypatch):
    """Where CUDA is present and FAISS has no GPU build, ``dense_search`` (what mining, evaluation and
    the BEIR stage call) takes the blocked PyTorch search; forced onto the CPU with tiny blocks, its
    runs equal FAISS's, ties included: the same scores, the same passages above the k-th score, and
    at the k-th place the tied passages trec_eval ranks first (highest document ids)."""
    import faiss
    import torch

    from qac.retrieval.search import search_backend

    rng = np.random.default_rng(3)
    passages = rng.integers(-2, 3, size=(257, 6)).astype(np.float32)   # exact products, many ties
    passages[100:110] = passages[5]                                      # duplicate passages tie everywhere
    queries = rng.integers(-2, 3, size=(19, 6)).astype(np.float32)
    doc_ids = [f"d{rng.integers(0, 10**6):06d}-{i}" for i in range(len(passages))]
    qids = [f"q{i}" for i in range(len(queries))]

    assert faiss.get_num_gpus() == 0 and search_backend() == "faiss"
    faiss_run = dense_search(qids, queries, doc_ids, passages, k=20)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert search_backend() == "torch" and search_backend(use_gpu=False) == "faiss"
    monkeypatch.setenv("QAC_SEARCH_DEVICE", "cpu")
    monkeypatch.setenv("QAC_SEARCH_BLOCKS", "4,37")       # 5 query blocks x 7 corpus blocks: every merge path
    torch_run = dense_search(qids, queries, doc_ids, passages, k=20)

    boundary_ties = 0
    for qid, query in zip(qids, queries):
        exact = dict(zip(doc_ids, (passages @ query).tolist()))
        ours, theirs = torch_run[qid], faiss_run[qid]
        assert sorted(ours.values()) == sorted(theirs.values())
        assert all(exact[doc] == score for doc, score in ours.items())
        kth = min(ours.values())
        assert {d for d, s in ours.items() if s > kth} == {d for d, s in theirs.items() if s > kth}
        tied = sorted((d for d, s in exact.items() if s == kth), reverse=True)
        at_kth = sum(1 for s in ours.values() if s == kth)
        assert sorted((d for d, s in ours.items() if s == kth), reverse=True) == tied[:at_kth]
        boundary_ties += len(tied) > at_kth
    assert boundary_ties > 0                                  # the data does put ties across the k-th place
