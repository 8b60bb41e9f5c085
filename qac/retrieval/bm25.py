"""BM25 retrieval with the ``bm25s`` library.

Scoring is bm25s's ``lucene`` variant. A document that shares no term with
the query scores 0 and is not returned, as in Lucene (bm25s would otherwise
fill the top k with arbitrary zeros).

Two analyzers (``BM25Settings.tokenizer``, with ``stopwords`` and ``stemmer``):

- ``bm25s``: bm25s's own tokenisation (lower-cased ``\\w\\w+`` words), here with
  bm25s's English stopwords and the Snowball English stemmer (PyStemmer).
- ``lucene``: as close to Lucene's EnglishAnalyzer (Anserini's default, the
  analyzer behind the MS MARCO and BEIR BM25 figures of Pyserini) as bm25s
  allows: words split at UAX#29-like boundaries (single letters and digits
  kept, ``don't``, ``u.s.a`` and ``1,000`` one token), the English possessive
  ``'s`` dropped, lower-cased, then ``stopwords: lucene`` (Lucene's 33-word
  English set) and ``stemmer: porter`` (Lucene's PorterStemFilter).
  Not identical to Lucene: the Unicode word-break rules are approximated by one
  regular expression (no special cases for scripts without spaces, URLs or
  tokens over 255 characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from qac.params.vocabulary import Bm25Tokenizer

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (StopFilter's default English set).
LUCENE_ENGLISH_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with")
BM25S_PATTERN = r"(?u)\b\w\w+\b"
# A run of word characters, joined across an apostrophe or a period between word characters (UAX#29's MidLetter
# and MidNumLet) and across a comma or semicolon between digits (MidNum), as Lucene's StandardTokenizer.
LUCENE_PATTERN = r"(?u)\w+(?:(?:['’.]|(?<=\d)[,;](?=\d))\w+)*"
# EnglishPossessiveFilter: a trailing 's (or ’s) of a token is dropped.
_POSSESSIVE = re.compile(r"(?u)(?<=\w)['’][sS](?!\w)")


@dataclass(frozen=True)
class BM25Settings:
    k1: float  # Pyserini's MS MARCO / BEIR defaults
    b: float
    stopwords: str | None  # bm25s's list by name (en), lucene (Lucene's English set), None: none
    stemmer: str | None  # a PyStemmer algorithm (english: Snowball, porter), None: none
    tokenizer: Bm25Tokenizer  # bm25s or lucene (module docstring)

    @classmethod
    def from_params(cls, section: Mapping[str, Any]) -> "BM25Settings":
        """The analyzer and scoring keys of the params ``bm25`` section (the others say what is indexed)."""
        return cls(**{f.name: section[f.name] for f in fields(cls)})

    @property
    def stopword_list(self) -> str | list[str] | None:
        if self.stopwords == "lucene":
            return list(LUCENE_ENGLISH_STOPWORDS)
        return self.stopwords or None


class BM25Index:
    """A bm25s index over a corpus, queried by text."""

    def __init__(self, doc_ids: Sequence[str], texts: Sequence[str], settings: BM25Settings):
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
        texts = list(texts)
        pattern = BM25S_PATTERN
        if self.settings.tokenizer == "lucene":
            texts = [_POSSESSIVE.sub("", text) for text in texts]
            pattern = LUCENE_PATTERN
        return bm25s.tokenize(texts, token_pattern=pattern, stopwords=self.settings.stopword_list,
                              stemmer=stemmer, return_ids=as_ids, show_progress=False)

    def analyze(self, text: str) -> list[str]:
        """The terms ``text`` becomes (what is indexed and searched)."""
        return list(self._tokenize([text])[0])

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


def bm25_search(doc_ids: Sequence[str], texts: Sequence[str], queries: dict[str, str], k: int,
                settings: BM25Settings) -> dict[str, dict[str, float]]:
    """Index ``texts`` and return the top ``k`` run for ``queries``."""
    return BM25Index(doc_ids, texts, settings).search(queries, k)
