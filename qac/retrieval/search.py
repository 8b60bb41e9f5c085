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


def tie_ranks(doc_ids: Sequence[str]) -> np.ndarray:
    """Rank of each document id in string order: trec_eval breaks score ties by document id, descending."""
    ranks = np.empty(len(doc_ids), dtype=np.int64)
    ranks[np.argsort(np.asarray(doc_ids, dtype=object), kind="stable")] = np.arange(len(doc_ids))
    return ranks


def search_reference(queries: np.ndarray, passages: np.ndarray, k: int,
                     ranks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` in NumPy, ordered as trec_eval orders a run: score descending, then document
    id descending (``ranks`` from :func:`tie_ranks`; None: row number). The definition the GPU search
    must equal, ties included."""
    queries = _as_float32("query embeddings", queries)
    passages = _as_float32("passage embeddings", passages)
    ranks = np.arange(len(passages)) if ranks is None else np.asarray(ranks)
    k = min(k, len(passages))
    scores = queries @ passages.T
    order = np.lexsort((-ranks[None, :].repeat(len(queries), 0), -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, 1), order


def torch_search(queries: np.ndarray, passages: np.ndarray, k: int = 1000, ranks: np.ndarray | None = None,
                 device=None, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` by inner product with a float32 matrix product and ``torch.topk`` (on a GPU
    when ``device`` is one), equal to :func:`search_reference` ties included.

    ``topk`` picks among equal scores arbitrarily, so where the k-th score of a
    row is shared beyond the k-th place, every passage scoring at least that
    much is gathered and the row is ordered by (score, document id) descending.
    Needs only PyTorch (no FAISS).
    """
    import torch

    queries = _as_float32("query embeddings", queries)
    passages = _as_float32("passage embeddings", passages)
    if queries.shape[1] != passages.shape[1]:
        raise ValueError(f"query dimension {queries.shape[1]} != passage dimension {passages.shape[1]}")
    device = torch.device(device or "cpu")
    k = min(k, len(passages))
    ranks_t = torch.as_tensor(np.arange(len(passages)) if ranks is None else np.asarray(ranks),
                              dtype=torch.int64, device=device)
    matrix = torch.from_numpy(passages).to(device)
    scores_out = np.empty((len(queries), k), dtype=np.float32)
    indices_out = np.empty((len(queries), k), dtype=np.int64)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False      # exact float32 products on the GPU too
    try:
        with torch.inference_mode():
            for start in range(0, len(queries), batch_size):
                block = torch.from_numpy(queries[start:start + batch_size]).to(device) @ matrix.T
                top_scores, top_indices = block.topk(k, dim=1)
                # rows where passages outside the top k tie with its last score
                tied = (block >= top_scores[:, -1:]).sum(1) > k
                # within the top k, equal scores ordered by document id, descending
                order = _lexsort_desc(top_scores, ranks_t[top_indices])
                top_scores, top_indices = top_scores.gather(1, order), top_indices.gather(1, order)
                for row in torch.nonzero(tied).flatten().tolist():
                    candidates = torch.nonzero(block[row] >= top_scores[row, -1]).flatten()
                    order = _lexsort_desc(block[row, candidates][None], ranks_t[candidates][None])[0, :k]
                    top_indices[row] = candidates[order]
                    top_scores[row] = block[row, top_indices[row]]
                scores_out[start:start + len(block)] = top_scores.float().cpu().numpy()
                indices_out[start:start + len(block)] = top_indices.cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return scores_out, indices_out


def _lexsort_desc(scores, ranks):
    """Per row, the order of (score desc, rank desc): a stable sort by rank, then by score."""
    import torch

    by_rank = torch.sort(ranks, dim=1, descending=True, stable=True).indices
    by_score = torch.sort(scores.gather(1, by_rank), dim=1, descending=True, stable=True).indices
    return by_rank.gather(1, by_score)


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
