"""Hard negatives mined with a fine-tuned retriever (the second stage's training data).

Retriever 1 encodes the corpus and the training queries, retrieves the top
``depth`` documents of each query by exact inner product, and the documents
there that are not positives (below rank ``skip_top``) become that query's
negatives, in rank order (``sample`` of them drawn at random once, where
given). Only the training queries handed in are encoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from qac.models.biencoder import BiEncoder
from qac.train.groups import TrainingQuery
from qac.distributed import init_distributed
from qac.retrieval.encode import encode_distributed
from qac.retrieval.mining import negatives_records
from qac.retrieval.search import dense_search

if TYPE_CHECKING:
    import numpy as np


def encode_corpus(model: BiEncoder, tokenizer, passage_text: Mapping[str, str], *, passage_max_len: int,
                  batch_size: int = 128, loader_workers: int = 0, dist=None) -> tuple[list[str], "np.ndarray | None"]:
    """``(doc ids, vectors)`` of the corpus, the vectors on the main process only (None elsewhere);
    every process of ``dist`` encodes a share."""
    dist = dist or init_distributed()
    model.eval().to(dist.device)
    doc_ids = list(passage_text)
    vectors = encode_distributed(model.encoder, tokenizer, [passage_text[d] for d in doc_ids], dist,
                                 max_length=passage_max_len, batch_size=batch_size, pooling=model.pooling,
                                 device=dist.device, loader_workers=loader_workers)
    return doc_ids, vectors


def mine_with_retriever(
    model: BiEncoder,
    tokenizer,
    queries: Sequence[TrainingQuery],
    passage_text: Mapping[str, str],
    *,
    depth: int,
    skip_top: int = 0,
    sample: int | None = None,
    seed: int = 0,
    query_max_len: int,
    passage_max_len: int,
    batch_size: int = 128,
    loader_workers: int = 0,
    dist=None,
    corpus: tuple[list[str], "np.ndarray | None"] | None = None,
) -> list[dict] | None:
    """Records ``{qid, positives, negatives}`` (the ``bm25/negatives.jsonl`` format), one per query.

    With ``dist`` (a ``DistContext`` under torchrun) every process encodes a
    share of the corpus and the main process searches; it alone gets the
    records, the others None. ``corpus``: the corpus as :func:`encode_corpus`
    returned it, when the caller keeps the vectors for more searches.
    """
    dist = dist or init_distributed()
    if corpus is None:
        corpus = encode_corpus(model, tokenizer, passage_text, passage_max_len=passage_max_len,
                               batch_size=batch_size, loader_workers=loader_workers, dist=dist)
    doc_ids, doc_vectors = corpus
    model.eval().to(dist.device)
    query_vectors = encode_distributed(model.encoder, tokenizer, [q.text for q in queries], dist,
                                       max_length=query_max_len, batch_size=batch_size, pooling=model.pooling,
                                       device=dist.device, loader_workers=loader_workers)
    if not dist.is_main:
        return None
    run = dense_search([q.qid for q in queries], query_vectors, doc_ids, doc_vectors, k=depth)
    qrels = {q.qid: dict.fromkeys(q.positives, 1) for q in queries}
    return negatives_records(run, qrels, depth, skip_top, sample=sample, seed=seed)
