"""Dense retrieval end to end: encode the corpus and the queries, search, return a run.

What the evaluation of a retriever and the mining of retriever-1 negatives both
do. Under ``torchrun`` (pass ``ctx``) the corpus encoding is shared across ranks
and only rank 0 searches; other ranks get ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from qac.retrieval.encode import encode_distributed, encode_texts
from qac.retrieval.search import dense_search


@dataclass(frozen=True)
class DenseSettings:
    query_max_length: int = 32
    passage_max_length: int = 144
    batch_size: int = 128
    pooling: str = "cls"
    dtype: str = "auto"
    depth: int = 1000


def dense_retrieve(model, tokenizer, doc_ids: Sequence[str], doc_texts: Sequence[str],
                   queries: Mapping[str, str], settings: DenseSettings = DenseSettings(), ctx=None,
                   passage_embeddings: np.ndarray | None = None) -> dict[str, dict[str, float]] | None:
    """Top ``settings.depth`` documents per query by inner product of [CLS] (or mean) embeddings.

    ``passage_embeddings`` skips encoding the corpus when the caller already has
    it (one corpus, several query sets).
    """
    if len(doc_ids) != len(doc_texts):
        raise ValueError(f"{len(doc_ids)} document ids for {len(doc_texts)} texts")
    common = dict(batch_size=settings.batch_size, pooling=settings.pooling, dtype=settings.dtype)
    if passage_embeddings is None:
        if ctx is not None:
            passage_embeddings = encode_distributed(model, tokenizer, list(doc_texts), ctx,
                                                    max_length=settings.passage_max_length, **common)
        else:
            passage_embeddings = encode_texts(model, tokenizer, doc_texts, max_length=settings.passage_max_length,
                                              **common)
    if ctx is not None and not ctx.is_main:
        return None
    query_ids = list(queries)
    query_embeddings = encode_texts(model, tokenizer, [queries[q] for q in query_ids],
                                    max_length=settings.query_max_length, **common)
    return dense_search(query_ids, query_embeddings, list(doc_ids), passage_embeddings, k=settings.depth)
