"""Exact maximum inner product search with FAISS (``IndexFlatIP``).

Exhaustive search, as in Tevatron's evaluation: no approximation can blur a
comparison between pre-training variants. The index moves to the GPU when
FAISS was built with GPU support and a GPU is visible; otherwise it runs on
the CPU. Queries go in batches so memory stays bounded.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _as_float32(name: str, array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-d array, got shape {array.shape}")
    return array


def flat_ip_index(passages: np.ndarray, use_gpu: bool | None = None):
    """An exact inner-product index over ``passages`` (on GPU when available unless ``use_gpu=False``)."""
    import faiss

    passages = _as_float32("passage embeddings", passages)
    index = faiss.IndexFlatIP(passages.shape[1])
    index.add(passages)
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if use_gpu is None:
        use_gpu = gpus > 0
    if use_gpu:
        if gpus == 0:
            raise RuntimeError("use_gpu=True but FAISS sees no GPU (faiss-cpu, or no CUDA device)")
        index = faiss.index_cpu_to_all_gpus(index)
    return index


def search(queries: np.ndarray, passages: np.ndarray, k: int = 1000, batch_size: int = 4096,
           use_gpu: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` passages by inner product for every query: ``(scores, indices)``, each ``[n_queries, k']``.

    ``k' = min(k, n_passages)``; rows are sorted by score, descending.
    """
    queries = _as_float32("query embeddings", queries)
    passages = _as_float32("passage embeddings", passages)
    if queries.shape[1] != passages.shape[1]:
        raise ValueError(f"query dimension {queries.shape[1]} != passage dimension {passages.shape[1]}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, len(passages))
    from qac.console import progress

    index = flat_ip_index(passages, use_gpu)
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    with progress(total=len(queries), desc="search", unit="query") as bar:
        for start in range(0, len(queries), batch_size):
            batch_scores, batch_indices = index.search(queries[start:start + batch_size], k)
            scores[start:start + batch_size] = batch_scores
            indices[start:start + batch_size] = batch_indices
            bar.update(len(batch_scores))
    return scores, indices


def to_run(query_ids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray,
           indices: np.ndarray) -> dict[str, dict[str, float]]:
    """Turn search results into a run ``{qid: {doc id: score}}``."""
    if len(query_ids) != len(scores):
        raise ValueError(f"{len(query_ids)} query ids for {len(scores)} result rows")
    return {qid: {doc_ids[i]: float(s) for s, i in zip(row_scores, row_indices) if i >= 0}
            for qid, row_scores, row_indices in zip(query_ids, scores, indices)}


def dense_search(query_ids: Sequence[str], queries: np.ndarray, doc_ids: Sequence[str], passages: np.ndarray,
                 k: int = 1000, **kwargs) -> dict[str, dict[str, float]]:
    """Search and return a run; ``len(doc_ids)`` must match the passage rows."""
    if len(doc_ids) != len(passages):
        raise ValueError(f"{len(doc_ids)} document ids for {len(passages)} passage embeddings")
    scores, indices = search(queries, passages, k, **kwargs)
    return to_run(query_ids, doc_ids, scores, indices)
