"""Choosing among generated queries: round-trip consistency, a relevance share, near-copies.

- Round-trip consistency (Promptagator): a query is kept only if a retriever
  over the passages ranks its own passage within the top ``depth``. The
  retriever is BM25 (``bm25s``, English stop words) or the start encoder
  (mean-pooled, cosine; the encoder pre-training begins from).
- Relevance share (Doc2Query--): every query is scored against its own
  passage (BM25 or the encoder's cosine) and the best-scored ``keep_share`` of
  all the queries is kept: the threshold is a share of the whole set, not a
  fixed score, so it means the same for any scorer.
- Near-copies: a prompted model often writes a sentence of the passage back.
  A query whose longest run of words copied from the passage is over
  ``max_copied_share`` of its words is dropped (1.0 keeps them all). Copies
  pass both filters above (they retrieve their passage and score high), so
  this one runs first.

Each filter is a keep mask over the flat list of (passage, query) records;
:func:`apply_filters` runs the chosen ones in that order and counts what each
kept, as a share of what it was given and of all the queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class QueryRecord:
    """One generated query of passage ``passage`` (an index into the passages)."""

    passage: int
    text: str


def flatten(queries: Sequence[Sequence[str]]) -> list[QueryRecord]:
    """The queries of every passage, passage by passage, in generation order."""
    return [QueryRecord(index, text) for index, texts in enumerate(queries) for text in texts]


def regroup(records: Sequence[QueryRecord], keep: Sequence[bool], passages: int) -> list[list[str]]:
    """Per passage, its kept queries in their order."""
    grouped: list[list[str]] = [[] for _ in range(passages)]
    for record, kept in zip(records, keep):
        if kept:
            grouped[record.passage].append(record.text)
    return grouped


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"\w+", text.lower())


def copied_share(query: str, passage: str) -> float:
    """The longest run of the query's words that occurs, in order and contiguous, in the passage, over the
    query's word count (0 for an empty query)."""
    words, source = _words(query), _words(passage)
    if not words:
        return 0.0
    longest = 0
    previous = [0] * (len(source) + 1)
    for word in words:           # longest common substring over words, row by row
        current = [0] * (len(source) + 1)
        for j, other in enumerate(source, 1):
            if word == other:
                current[j] = previous[j - 1] + 1
                longest = max(longest, current[j])
        previous = current
    return longest / len(words)


def copy_mask(records: Sequence[QueryRecord], passages: Sequence[str], max_copied_share: float) -> list[bool]:
    """Keep a query unless more than ``max_copied_share`` of its words are one run copied from its passage."""
    return [copied_share(r.text, passages[r.passage]) <= max_copied_share for r in records]


def round_trip_mask(ranked: Sequence[Sequence[int]], records: Sequence[QueryRecord]) -> list[bool]:
    """Keep a query whose own passage is among the passages ``ranked[i]`` its retriever returned."""
    return [record.passage in set(top) for record, top in zip(records, ranked)]


def best_share_mask(scores: Sequence[float], keep_share: float) -> list[bool]:
    """Keep the ``ceil(keep_share * n)`` best-scored of ``n`` queries (ties: the earlier query first), so the
    kept set is a function of the scores and their order alone."""
    if not 0.0 <= keep_share <= 1.0:
        raise ValueError(f"keep_share must lie in [0, 1], got {keep_share}")
    keep = math.ceil(keep_share * len(scores) - 1e-9)
    best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:keep]
    mask = [False] * len(scores)
    for index in best:
        mask[index] = True
    return mask


class Bm25Passages:
    """BM25 (``bm25s``, English stop words) over the passages: the round trip's ranks and a relevance score."""

    def __init__(self, passages: Sequence[str]):
        import bm25s

        self._bm25s = bm25s
        self.count = len(passages)
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(list(passages), stopwords="en", show_progress=False), show_progress=False)

    def _tokens(self, texts: Sequence[str]):
        return self._bm25s.tokenize(list(texts), stopwords="en", show_progress=False, return_ids=False)

    def ranked(self, queries: Sequence[str], depth: int) -> list[list[int]]:
        """The passages each query ranks in its top ``depth`` with a positive score (a query of stop words
        ranks none)."""
        if not queries:
            return []
        depth = max(1, min(depth, self.count))
        results, scores = self.index.retrieve(self._bm25s.tokenize(list(queries), stopwords="en", show_progress=False),
                                              k=depth, show_progress=False)
        return [[int(d) for d, s in zip(row, score) if float(s) > 0] for row, score in zip(results, scores)]

    def scores(self, records: Sequence[QueryRecord]) -> list[float]:
        """BM25 score of each query against its own passage."""
        return [float(self.index.get_scores(words)[record.passage]) if words else 0.0
                for record, words in zip(records, self._tokens([r.text for r in records]))]


class EncoderPassages:
    """The start encoder over the passages (mean-pooled, L2-normalised): cosine ranks and scores."""

    def __init__(self, passages: Sequence[str], encoder, batch: int = 256):
        self.encoder = encoder               # has embed(texts) -> (n, d) unit vectors (EncoderCosineJudge)
        self.vectors = encoder.embed(list(passages))
        self.batch = batch

    def ranked(self, queries: Sequence[str], depth: int) -> list[list[int]]:
        import torch

        if not queries:
            return []
        depth = max(1, min(depth, self.vectors.shape[0]))
        ranked = []
        for start in range(0, len(queries), self.batch):
            similarities = self.encoder.embed(list(queries[start:start + self.batch])) @ self.vectors.T
            # ties broken by passage index (stable sort), so the ranks do not depend on topk's tie order
            order = torch.sort(-similarities, dim=1, stable=True).indices[:, :depth]
            ranked.extend(order.tolist())
        return ranked

    def scores(self, records: Sequence[QueryRecord]) -> list[float]:
        if not records:
            return []
        queries = self.encoder.embed([r.text for r in records])
        own = self.vectors[[r.passage for r in records]]
        return (queries * own).sum(dim=-1).tolist()


@dataclass(frozen=True)
class FilterSettings:
    """Which filters run and their thresholds (``llm_queries.filter``)."""

    max_copied_share: float
    round_trip: bool
    round_trip_retriever: str      # bm25 | encoder
    round_trip_depth: int
    relevance: bool
    relevance_scorer: str          # bm25 | encoder
    keep_share: float


def apply_filters(queries: Sequence[Sequence[str]], passages: Sequence[str], settings: FilterSettings,
                  retriever: Callable[[str], object]) -> tuple[list[list[str]], dict[str, float]]:
    """The kept queries per passage and the kept shares: ``kept_share/<filter>`` of what the filter was given,
    ``kept_share`` of all the queries. ``retriever(name)`` gives the :class:`Bm25Passages` or
    :class:`EncoderPassages` of ``name``."""
    records = flatten(queries)
    keep = [True] * len(records)
    figures: dict[str, float] = {"queries_before": len(records)}

    def narrow(name: str, mask_of: Callable[[list[QueryRecord]], list[bool]]) -> None:
        alive = [i for i, kept in enumerate(keep) if kept]
        mask = mask_of([records[i] for i in alive]) if alive else []
        for i, kept in zip(alive, mask):
            keep[i] = kept
        figures[f"kept_share/{name}"] = sum(mask) / len(alive) if alive else 0.0

    if settings.max_copied_share < 1.0:
        narrow("copies", lambda alive: copy_mask(alive, passages, settings.max_copied_share))
    if settings.round_trip:
        index = retriever(settings.round_trip_retriever)
        narrow("round_trip", lambda alive: round_trip_mask(index.ranked([r.text for r in alive],
                                                                        settings.round_trip_depth), alive))
    if settings.relevance:
        scorer = retriever(settings.relevance_scorer)
        narrow("relevance", lambda alive: best_share_mask(scorer.scores(alive), settings.keep_share))
    kept = sum(keep)
    figures.update({"queries_after": kept, "kept_share": kept / len(records) if records else 0.0,
                    "passages_without_query": sum(1 for texts in regroup(records, keep, len(queries)) if not texts)})
    return regroup(records, keep, len(queries)), figures
