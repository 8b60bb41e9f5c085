"""Retrieval: BM25 (bm25s), dense encoding, FAISS search and hard-negative mining.

A run is ``{query id: {doc id: score}}`` everywhere, ranked by trec_eval's
order (``qac.evaluation.metrics.trec_order``).
"""

from __future__ import annotations


def document_text(title: str | None, text: str | None) -> str:
    """The text a document is retrieved by, for BM25 and dense retrieval alike: title, a space, body; stripped."""
    return f"{title or ''} {text or ''}".strip()
