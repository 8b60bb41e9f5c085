"""Exact maximum inner product search: FAISS (``IndexFlatIP``) or a blocked PyTorch search.

Exhaustive search, as in Tevatron's evaluation: no approximation can blur a
comparison between pre-training variants. Where a GPU is visible the search
runs on it: through FAISS when its GPU build is installed (the ``gpu`` extra,
where the package index has it for the platform), otherwise through
:func:`torch_search`, whose blocks follow the card's free memory. Without a
GPU, FAISS searches on the CPU. Queries go in batches so memory stays bounded.
Both give the same runs; the PyTorch search also orders equal scores as
trec_eval reads a run (document id descending), at the k-th place too.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from qac.console import progress


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


BACKENDS = ("auto", "faiss", "torch")
# Where the stages search, set from the environment (how a run is executed, not what it computes):
# QAC_SEARCH_BACKEND (auto, faiss, torch), QAC_SEARCH_DEVICE (cpu, cuda, cuda:1) and
# QAC_SEARCH_BLOCKS ("queries,passages": the PyTorch search's block rows; default from free memory).


def search_backend(backend: str | None = None, use_gpu: bool | None = None) -> str:
    """The backend ``auto`` stands for: FAISS where its GPU build sees a GPU, the PyTorch search on a
    CUDA device otherwise (or where FAISS is not installed), FAISS on the CPU without a GPU.
    ``use_gpu=False`` keeps FAISS on the CPU."""
    backend = backend or os.environ.get("QAC_SEARCH_BACKEND") or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"search backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    try:
        import faiss
    except ImportError:
        return "torch"
    if use_gpu is False or (hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0):
        return "faiss"
    import torch

    return "torch" if torch.cuda.is_available() else "faiss"


def search(queries: np.ndarray, passages: np.ndarray, k: int = 1000, batch_size: int = 4096,
           use_gpu: bool | None = None, backend: str | None = None, ranks: np.ndarray | None = None,
           device=None, **blocks) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` passages by inner product for every query: ``(scores, indices)``, each ``[n_queries, k']``.

    ``k' = min(k, n_passages)``; rows are sorted by score, descending. ``backend``: see
    :func:`search_backend`; the PyTorch search runs on ``device`` (default: the GPU where there is
    one), breaks ties by ``ranks`` (:func:`tie_ranks`) and takes ``query_block`` and
    ``passage_block`` (``blocks``) for its block sizes.
    """
    if search_backend(backend, use_gpu) == "torch":
        import torch

        device = device or os.environ.get("QAC_SEARCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
        if not blocks and os.environ.get("QAC_SEARCH_BLOCKS"):
            rows = os.environ["QAC_SEARCH_BLOCKS"].split(",")
            blocks = {"query_block": int(rows[0]), "passage_block": int(rows[1])}
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return torch_search(queries, passages, k, ranks=ranks, device=device, **blocks)
    queries = _as_float32("query embeddings", queries)
    passages = _as_float32("passage embeddings", passages)
    if queries.shape[1] != passages.shape[1]:
        raise ValueError(f"query dimension {queries.shape[1]} != passage dimension {passages.shape[1]}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, len(passages))

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


def torch_search(queries, passages, k: int = 1000, ranks: np.ndarray | None = None, device=None,
                 query_block: int | None = None, passage_block: int | None = None,
                 memory_fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Exact top ``k`` by inner product with float32 matrix products and ``torch.topk`` (on a GPU
    when ``device`` is one), equal to :func:`search_reference` ties included.

    ``queries`` and ``passages`` are arrays or tensors (a corpus already on the device stays
    there). The corpus goes through in blocks of ``passage_block`` rows, each moved to the device
    once; every block's top ``k`` is merged into a running top ``k`` per query, so the scores held
    at a time are ``query_block x passage_block``, never a full row of the corpus. Left at None,
    the blocks follow the device's free memory (``memory_fraction`` of it for the scores): MS MARCO's
    8.8M x 768 float32 vectors (27 GB) and its scores fit one 80 GB card.

    ``topk`` picks among equal scores arbitrarily, so where the k-th score of a block is shared
    beyond the k-th place, every passage of the block scoring at least that much is gathered and
    ordered by (score, document id) descending; the merge keeps that order. Needs only PyTorch.
    """
    import torch

    queries, passages = _as_float32_tensor("query embeddings", queries), _as_float32_tensor("passage embeddings",
                                                                                             passages)
    if queries.shape[1] != passages.shape[1]:
        raise ValueError(f"query dimension {queries.shape[1]} != passage dimension {passages.shape[1]}")
    device = torch.device(device) if device is not None else passages.device
    n_queries, n_passages = len(queries), len(passages)
    k = min(k, n_passages)
    default_queries, default_passages = search_blocks(n_queries, n_passages, passages.shape[1], k, device,
                                                      memory_fraction)
    query_block, passage_block = query_block or default_queries, passage_block or default_passages
    ranks_t = torch.as_tensor(np.arange(n_passages) if ranks is None else np.asarray(ranks), dtype=torch.int64,
                              device=device)
    queries = queries.to(device, torch.float32)
    best_scores = torch.full((n_queries, k), -torch.inf, device=device)
    best_indices = torch.full((n_queries, k), -1, dtype=torch.int64, device=device)
    best_ranks = torch.full((n_queries, k), -1, dtype=torch.int64, device=device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False      # exact float32 products on the GPU too
    try:
        with torch.inference_mode():
            for first in range(0, n_passages, passage_block):
                block = passages[first:first + passage_block].to(device, torch.float32, non_blocking=True)
                block_ranks = ranks_t[first:first + len(block)]
                for start in range(0, n_queries, query_block):
                    rows = slice(start, start + query_block)
                    scores, indices = block_top_k(queries[rows] @ block.T, block_ranks, k)
                    merged_scores = torch.cat([best_scores[rows], scores], 1)
                    merged_indices = torch.cat([best_indices[rows], indices + first], 1)
                    merged_ranks = torch.cat([best_ranks[rows], block_ranks[indices]], 1)
                    order = _lexsort_desc(merged_scores, merged_ranks)[:, :k]
                    best_scores[rows] = merged_scores.gather(1, order)
                    best_indices[rows] = merged_indices.gather(1, order)
                    best_ranks[rows] = merged_ranks.gather(1, order)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return best_scores.cpu().numpy(), best_indices.cpu().numpy()


def block_top_k(scores, ranks, k: int):
    """Per row of ``scores`` (one corpus block), its top ``k`` (or all its columns) ordered by
    (score, rank) descending, exact where equal scores straddle the k-th place."""
    import torch

    k = min(k, scores.shape[1])
    top_scores, top_indices = scores.topk(k, dim=1)
    order = _lexsort_desc(top_scores, ranks[top_indices])
    top_scores, top_indices = top_scores.gather(1, order), top_indices.gather(1, order)
    # rows where columns outside the top k tie with its last score: one host read per block
    tied = ((scores >= top_scores[:, -1:]).sum(1) > k).nonzero().flatten().tolist()
    for row in tied:
        candidates = torch.nonzero(scores[row] >= top_scores[row, -1]).flatten()
        order = _lexsort_desc(scores[row, candidates][None], ranks[candidates][None])[0, :k]
        top_indices[row] = candidates[order]
        top_scores[row] = scores[row, top_indices[row]]
    return top_scores, top_indices


def search_blocks(n_queries: int, n_passages: int, dim: int, k: int, device, memory_fraction: float = 0.5,
                  cpu_bytes: int = 1 << 30) -> tuple[int, int]:
    """``(query rows, passage rows)`` of a score block that fits the memory left for it: on a GPU
    ``memory_fraction`` of its free memory less the running top k, on the CPU ``cpu_bytes``. A score
    costs about 8 bytes (float32 score, its comparison with the k-th, top-k workspace)."""
    import torch

    query_rows = min(n_queries, 8192 if device.type == "cuda" else 1024)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        available = memory_fraction * free - n_queries * k * 20 - 4 * dim * query_rows
    else:
        available = cpu_bytes
    passage_rows = int(max(available, 0) // (8 * query_rows + 4 * dim))
    return query_rows, max(min(n_passages, passage_rows), min(n_passages, max(k, 1024)))


def _as_float32_tensor(name: str, values):
    import torch

    if isinstance(values, torch.Tensor):
        if values.ndim != 2:
            raise ValueError(f"{name} must be a 2-d array, got shape {tuple(values.shape)}")
        return values          # converted block by block, so a half-precision corpus is never copied whole
    return torch.from_numpy(_as_float32(name, values))


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
    if search_backend(kwargs.get("backend"), kwargs.get("use_gpu")) == "torch":
        kwargs["ranks"] = tie_ranks(doc_ids)
    scores, indices = search(queries, passages, k, **kwargs)
    return to_run(query_ids, doc_ids, scores, indices)
