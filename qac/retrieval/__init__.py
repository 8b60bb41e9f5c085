"""Retrieval: BM25 (bm25s), dense encoding, FAISS search and hard-negative mining.

- :mod:`qac.retrieval.bm25`: ``BM25Index(doc_ids, texts, BM25Settings()).search(queries, k)``;
- :mod:`qac.retrieval.encode`: ``encode_texts`` (length-sorted, [CLS]/mean pooling, autocast on GPU),
  ``encode_distributed`` (shares across torchrun ranks, gathered on rank 0);
- :mod:`qac.retrieval.search`: exact FAISS inner-product ``search`` / ``dense_search``;
- :mod:`qac.retrieval.dense`: ``dense_retrieve`` (encode corpus and queries, search, return a run);
- :mod:`qac.retrieval.mining`: ``mine_hard_negatives`` and the negatives-file records.

A run is ``{query id: {doc id: score}}`` everywhere, ranked by trec_eval's
order (``qac.evaluation.metrics.trec_order``).
"""

from __future__ import annotations


def document_text(title: str | None, text: str | None) -> str:
    """The text a document is retrieved by, for BM25 and dense retrieval alike: title, a space, body; stripped."""
    return f"{title or ''} {text or ''}".strip()
