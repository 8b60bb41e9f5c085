"""BM25 retrieval with the ``bm25s`` library.

Documents are indexed by ``document_text(title, text)``. Tokenisation is
bm25s's (lower-cased ``\\w\\w+`` words), with English stopwords removed and the
Snowball English stemmer (PyStemmer) by default, close to the Lucene/Pyserini
BM25 baselines of BEIR and MS MARCO. Scoring is bm25s's ``lucene`` variant.
A document that shares no term with the query scores 0 and is not returned,
as in Lucene (bm25s would otherwise fill the top k with arbitrary zeros).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class BM25Settings:
    k1: float = 0.9          # Pyserini's MS MARCO / BEIR defaults
    b: float = 0.4
    stopwords: str | None = "en"
    stemmer: str | None = "english"


class BM25Index:
    """A bm25s index over a corpus, queried by text."""

    def __init__(self, doc_ids: Sequence[str], texts: Sequence[str], settings: BM25Settings = BM25Settings()):
        import bm25s

        if len(doc_ids) != len(texts):
            raise ValueError(f"{len(doc_ids)} document ids for {len(texts)} texts")
        if not doc_ids:
            raise ValueError("cannot index an empty corpus")
        self.doc_ids = list(doc_ids)
        self.settings = settings
        self._retriever = bm25s.BM25(k1=settings.k1, b=settings.b, method="lucene")
        # Token ids with a vocabulary, not lists of strings: a fraction of the memory on large corpora.
        self._retriever.index(self._tokenize(texts, as_ids=True), show_progress=False)

    def _tokenize(self, texts: Sequence[str], as_ids: bool = False):
        import bm25s

        stemmer = None
        if self.settings.stemmer:
            import Stemmer

            stemmer = Stemmer.Stemmer(self.settings.stemmer)
        return bm25s.tokenize(list(texts), stopwords=self.settings.stopwords or None, stemmer=stemmer,
                              return_ids=as_ids, show_progress=False)

    def search(self, queries: dict[str, str], k: int = 1000) -> dict[str, dict[str, float]]:
        """Top ``k`` documents per query as a run ``{qid: {doc id: score}}`` (zero scores left out)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        qids = list(queries)
        run: dict[str, dict[str, float]] = {qid: {} for qid in qids}
        if not qids:
            return run
        k = min(k, len(self.doc_ids))
        indices, scores = self._retriever.retrieve(self._tokenize([queries[q] for q in qids]), k=k,
                                                   show_progress=False)
        for qid, row_indices, row_scores in zip(qids, indices, scores):
            run[qid] = {self.doc_ids[i]: float(s) for i, s in zip(row_indices, row_scores) if s > 0}
        return run


def bm25_search(doc_ids: Sequence[str], texts: Sequence[str], queries: dict[str, str], k: int = 1000,
                settings: BM25Settings = BM25Settings()) -> dict[str, dict[str, float]]:
    """Index ``texts`` and return the top ``k`` run for ``queries``."""
    return BM25Index(doc_ids, texts, settings).search(queries, k)
