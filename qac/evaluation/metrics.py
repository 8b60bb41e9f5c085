"""Retrieval metrics with trec_eval semantics, fast enough for MS MARCO-sized runs.

Each query's ranking is reduced to the ranks of its positively judged documents
(a sort and a binary search per query, no full ranking materialised); every
measure is then computed for all queries at once with numpy.

Every number in the study's tables comes from :func:`evaluate`, and each
measure agrees with ``trec_eval`` (through ``pytrec_eval``) to 1e-6; the tests
check this on random qrels and runs. The conventions, in full:

* **Ranking.** A run maps each query to ``{doc_id: score}``. Documents are
  ranked as trec_eval ranks them: by score, descending, ties broken by document
  id, descending (byte order). Ranks in a run file are ignored.
* **Relevance.** Binary measures (RR, R, Hit, P, AP) count a document as
  relevant when its label is ``>= rel_threshold`` (trec_eval's
  ``relevance_level``; TREC DL uses 2). nDCG always uses the graded labels as
  gains (negative labels count 0) and its ideal ranking orders every judged
  document with a positive label, whatever the threshold.
* **Which queries.** The average is over every query that has at least one
  judgement in the qrels, as ``trec_eval -c`` does: a query missing from the
  run, or with no relevant document retrieved, contributes 0. A query whose
  judgements are all below the threshold (no relevant document at all) is kept
  and scores 0 on every measure, exactly as trec_eval and pytrec_eval report it;
  it is not silently dropped, so the denominator is the size of the qrels.
  Run queries absent from the qrels are ignored. (pytrec_eval reports only the
  queries present in both the run and the qrels; on those its per-query values
  equal ours, and ours adds zeros for the rest.)
* **Identical ids.** With ``ignore_identical_ids`` a retrieved document whose id
  equals the query id is dropped before ranking (BEIR's convention for ArguAna
  and Quora, where the query is itself a corpus document).

Measure names follow ir-measures: ``RR@10`` (MRR@10 when averaged; ``RR`` has no
cutoff), ``R@50`` (recall: share of the query's relevant documents in the top
50), ``Hit@50`` (1 if any relevant document is in the top 50; what the official
MS MARCO script calls "recall"), ``P@10``, ``nDCG@10`` (trec_eval
``ndcg_cut.10``; ``nDCG`` without cutoff), ``AP`` (average precision over the
whole run; MAP when averaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from qac.params.measures import Measure

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]

DEFAULT_MEASURES = ("RR@10", "R@50", "R@1000", "Hit@50", "Hit@1000", "nDCG@10", "AP")

__all__ = ["DEFAULT_MEASURES", "EvalResult", "Measure", "evaluate", "trec_order"]


@dataclass(frozen=True)
class EvalResult:
    """Mean of each measure over the evaluated queries, and every per-query value."""

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]

    @property
    def query_ids(self) -> list[str]:
        return list(next(iter(self.per_query.values()), {}))


def trec_order(doc_scores: Mapping[str, float]) -> list[str]:
    """Document ids in trec_eval's ranking: score descending, ties by document id descending."""
    return [doc for doc, _ in sorted(doc_scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def evaluate(
    qrels: Qrels,
    run: Run,
    measures: Iterable[str] = DEFAULT_MEASURES,
    rel_threshold: int = 1,
    ignore_identical_ids: bool = False,
) -> EvalResult:
    """Evaluate ``run`` against ``qrels`` with trec_eval semantics (see the module docstring)."""
    parsed = [Measure.parse(name) for name in measures]
    if not parsed:
        raise ValueError("no measures requested")
    if rel_threshold < 1:
        # trec_eval never counts an unjudged document as relevant; a threshold
        # below 1 would make judged zeros relevant but unjudged documents not.
        raise ValueError(f"rel_threshold must be >= 1, got {rel_threshold}")
    query_ids = [qid for qid, judged in qrels.items() if judged]
    if not query_ids:
        raise ValueError("the qrels hold no judgements")
    ranked = _RankedRun.build(qrels, run, query_ids, ignore_identical_ids)
    num_relevant = np.array(
        [sum(1 for label in qrels[qid].values() if label >= rel_threshold) for qid in query_ids], dtype=np.float64
    )
    relevant = ranked.labels >= rel_threshold

    per_query: dict[str, dict[str, float]] = {}
    aggregate: dict[str, float] = {}
    for measure in parsed:
        values = _compute(measure, ranked, relevant, num_relevant, qrels, query_ids)
        per_query[measure.name] = dict(zip(query_ids, values.tolist()))
        aggregate[measure.name] = float(values.mean())
    return EvalResult(aggregate=aggregate, per_query=per_query)


@dataclass(frozen=True)
class _RankedRun:
    """The positively judged documents of a run with their trec_eval ranks, sorted by query then rank.

    Documents that are unjudged or judged <= 0 add nothing to any measure (they
    only take up ranks), so they are counted but not kept; this keeps a
    7,000 x 1,000 run cheap.
    """

    owner: np.ndarray    # index of the query (into query_ids) each entry belongs to
    rank: np.ndarray     # 0-based rank within its query's ranking
    labels: np.ndarray   # qrels label (> 0), float64
    n_queries: int

    @classmethod
    def build(cls, qrels: Qrels, run: Run, query_ids: list[str], ignore_identical_ids: bool) -> "_RankedRun":
        owners: list[int] = []
        ranks: list[int] = []
        labels: list[float] = []
        for index, qid in enumerate(query_ids):
            retrieved = run.get(qid)
            if not retrieved:
                continue
            if ignore_identical_ids and qid in retrieved:
                retrieved = {doc: score for doc, score in retrieved.items() if doc != qid}
            scores = np.fromiter(retrieved.values(), dtype=np.float64, count=len(retrieved))
            if np.isnan(scores).any():
                raise ValueError(f"query {qid!r}: the run contains NaN scores")
            ascending = np.sort(scores)
            for doc, label in qrels[qid].items():
                if label <= 0 or doc not in retrieved:
                    continue
                score = float(retrieved[doc])
                lower = np.searchsorted(ascending, score, side="left")
                upper = np.searchsorted(ascending, score, side="right")
                rank = len(ascending) - upper             # documents with a higher score
                if upper - lower > 1:                     # tied: larger document ids rank first
                    rank += sum(1 for other, s in retrieved.items() if s == score and other > doc)
                owners.append(index)
                ranks.append(int(rank))
                labels.append(float(label))
        owner = np.asarray(owners, dtype=np.int64)
        rank = np.asarray(ranks, dtype=np.int64)
        order = np.lexsort((rank, owner))
        return cls(owner=owner[order], rank=rank[order], labels=np.asarray(labels, dtype=np.float64)[order],
                   n_queries=len(query_ids))


def _compute(measure: Measure, ranked: _RankedRun, relevant: np.ndarray, num_relevant: np.ndarray,
             qrels: Qrels, query_ids: list[str]) -> np.ndarray:
    n = ranked.n_queries
    in_cutoff = ranked.rank < measure.cutoff if measure.cutoff else np.ones(len(ranked.rank), dtype=bool)
    hits = relevant & in_cutoff
    values = np.zeros(n, dtype=np.float64)

    if measure.family in ("RR", "Hit"):
        # Entries are sorted by query then rank, so the first hit of a query is its best rank.
        queries, first = np.unique(ranked.owner[hits], return_index=True)
        if measure.family == "RR":
            values[queries] = 1.0 / (ranked.rank[hits][first] + 1.0)
        else:
            values[queries] = 1.0
        return values
    if measure.family in ("R", "P"):
        found = np.bincount(ranked.owner[hits], minlength=n).astype(np.float64)
        if measure.family == "P":
            return found / measure.cutoff
        np.divide(found, num_relevant, out=values, where=num_relevant > 0)
        return values
    if measure.family == "AP":
        # Precision at the rank of each relevant document: its position among the
        # query's relevant documents (1-based) over its rank (1-based).
        owner, rank = ranked.owner[relevant], ranked.rank[relevant]
        starts = np.searchsorted(owner, owner, side="left")
        precision = (np.arange(len(owner)) - starts + 1.0) / (rank + 1.0)
        summed = np.bincount(owner, weights=precision, minlength=n)
        np.divide(summed, num_relevant, out=values, where=num_relevant > 0)
        return values
    if measure.family == "nDCG":
        dcg = np.bincount(ranked.owner[in_cutoff],
                          weights=(ranked.labels / np.log2(ranked.rank + 2.0))[in_cutoff], minlength=n)
        ideal = _ideal_dcg(qrels, query_ids, measure.cutoff)
        np.divide(dcg, ideal, out=values, where=ideal > 0)
        return values
    raise AssertionError(measure)


def _ideal_dcg(qrels: Qrels, query_ids: list[str], cutoff: int | None) -> np.ndarray:
    """DCG of the best possible ranking: every positively judged document, best label first."""
    ideal = np.zeros(len(query_ids), dtype=np.float64)
    for index, qid in enumerate(query_ids):
        gains = np.sort(np.array([label for label in qrels[qid].values() if label > 0], dtype=np.float64))[::-1]
        if cutoff:
            gains = gains[:cutoff]
        ideal[index] = float(np.sum(gains / np.log2(np.arange(len(gains)) + 2.0)))
    return ideal
