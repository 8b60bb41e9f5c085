"""Dense retrieval end to end: encode the corpus and the queries, search, return a run.

What the evaluation of a retriever and the mining of retriever-1 negatives both
do. Under ``torchrun`` (pass ``ctx``) the corpus encoding is shared across ranks
and only rank 0 searches; other ranks get ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from qac.retrieval.encode import encode_distributed, encode_texts
from qac.retrieval.search import dense_search
from qac.retrieval.untuned import baseline_settings, start_encoder  # noqa: F401  (their home before)
from qac.evaluation.split_evaluation import evaluation_splits

if TYPE_CHECKING:
    from qac.params.sections import Params


@dataclass(frozen=True)
class DenseSettings:
    query_max_length: int
    passage_max_length: int
    batch_size: int
    pooling: str
    dtype: str
    depth: int
    normalize: bool


def dense_retrieve(model, tokenizer, doc_ids: Sequence[str], doc_texts: Sequence[str],
                   queries: Mapping[str, str], settings: DenseSettings, ctx=None,
                   passage_embeddings: np.ndarray | None = None) -> dict[str, dict[str, float]] | None:
    """Top ``settings.depth`` documents per query by inner product of [CLS] (or mean) embeddings.

    ``passage_embeddings`` skips encoding the corpus when the caller already has
    it (one corpus, several query sets).
    """
    if len(doc_ids) != len(doc_texts):
        raise ValueError(f"{len(doc_ids)} document ids for {len(doc_texts)} texts")
    common = dict(batch_size=settings.batch_size, pooling=settings.pooling, dtype=settings.dtype,
                  normalize=settings.normalize)
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


def search_splits(model, tokenizer, dataset, doc_ids: Sequence[str], doc_vectors: np.ndarray | None, *,
                  query_max_len: int, depth: int, dist=None, **options) -> dict[str, dict] | None:
    """``{split: run}`` of every evaluation split of ``dataset`` (all but ``train``) against an encoded corpus.

    ``model`` is a bi-encoder (its ``encoder`` and ``pooling``); ``options`` go to
    the query encoding (batch size, device, loader workers, normalisation).
    With ``dist`` (a ``DistContext`` under torchrun) the ranks share the query
    encoding and the main process, the only one holding ``doc_vectors``,
    searches; the others get None.
    """
    runs = {}
    for split in evaluation_splits(dataset):
        queries = dataset.split_queries(split)
        texts, common = list(queries.values()), dict(max_length=query_max_len, pooling=model.pooling,
                                                      desc=f"encode {dataset.name}/{split} queries", **options)
        vectors = (encode_distributed(model.encoder, tokenizer, texts, dist, **common) if dist is not None
                   else encode_texts(model.encoder, tokenizer, texts, **common))
        if dist is None or dist.is_main:
            runs[split] = dense_search(list(queries), vectors, list(doc_ids), doc_vectors, k=depth)
    return runs if dist is None or dist.is_main else None
