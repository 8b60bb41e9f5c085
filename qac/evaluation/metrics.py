"""Retrieval metrics with trec_eval semantics, computed for all queries at once with numpy.

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

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]

DEFAULT_MEASURES = ("RR@10", "R@50", "R@1000", "Hit@50", "Hit@1000", "nDCG@10", "AP")

_FAMILIES_WITH_OPTIONAL_CUTOFF = ("RR", "nDCG")
_FAMILIES_NEEDING_CUTOFF = ("R", "Hit", "P")
_FAMILIES_WITHOUT_CUTOFF = ("AP",)
_MEASURE_NAME = re.compile(r"^(RR|R|Hit|P|nDCG|AP)(?:@([1-9][0-9]*))?$")


@dataclass(frozen=True)
class Measure:
    """A parsed measure name: a family (``RR``, ``R``, ``Hit``, ``P``, ``nDCG``, ``AP``) and a cutoff."""

    family: str
    cutoff: int | None

    @classmethod
    def parse(cls, name: str) -> "Measure":
        match = _MEASURE_NAME.match(name.strip())
        if not match:
            raise ValueError(
                f"unknown measure {name!r}; use RR[@k], R@k, Hit@k, P@k, nDCG[@k] or AP (e.g. RR@10, nDCG@10)"
            )
        family, cutoff = match.group(1), match.group(2)
        cutoff = int(cutoff) if cutoff else None
        if family in _FAMILIES_NEEDING_CUTOFF and cutoff is None:
            raise ValueError(f"measure {name!r} needs a cutoff, e.g. {family}@100")
        if family in _FAMILIES_WITHOUT_CUTOFF and cutoff is not None:
            raise ValueError(f"measure {name!r}: AP is computed over the whole run; drop the cutoff")
        return cls(family, cutoff)

    @property
    def name(self) -> str:
        return self.family if self.cutoff is None else f"{self.family}@{self.cutoff}"


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
    """A run flattened into arrays in trec_eval order: one entry per retrieved document."""

    owner: np.ndarray    # index of the query (into query_ids) each entry belongs to
    rank: np.ndarray     # 0-based rank within its query
    labels: np.ndarray   # qrels label (0 if unjudged), float64
    n_queries: int

    @classmethod
    def build(cls, qrels: Qrels, run: Run, query_ids: list[str], ignore_identical_ids: bool) -> "_RankedRun":
        doc_ids: list[str] = []
        scores: list[float] = []
        labels: list[float] = []
        lengths = np.zeros(len(query_ids), dtype=np.int64)
        for index, qid in enumerate(query_ids):
            retrieved = run.get(qid)
            if not retrieved:
                continue
            if ignore_identical_ids and qid in retrieved:
                retrieved = {doc: score for doc, score in retrieved.items() if doc != qid}
            judged = qrels[qid]
            doc_ids.extend(retrieved)
            scores.extend(retrieved.values())
            labels.extend([judged.get(doc, 0) for doc in retrieved])
            lengths[index] = len(retrieved)

        owner = np.repeat(np.arange(len(query_ids)), lengths)
        score_array = np.asarray(scores, dtype=np.float64)
        if np.isnan(score_array).any():
            raise ValueError("the run contains NaN scores")
        # Stable sort by (query, score descending); only entries tied on both need
        # the document id, so only those pay for a string sort.
        order = np.lexsort((-score_array, owner))
        sorted_owner, sorted_scores = owner[order], score_array[order]
        same_as_previous = (sorted_owner[1:] == sorted_owner[:-1]) & (sorted_scores[1:] == sorted_scores[:-1])
        if same_as_previous.any():
            tied = np.zeros(len(order), dtype=bool)
            tied[1:] |= same_as_previous
            tied[:-1] |= same_as_previous
            doc_key = np.zeros(len(order), dtype=np.int64)
            tied_docs = np.array([doc_ids[i] for i in order[tied]])
            doc_key[order[tied]] = np.unique(tied_docs, return_inverse=True)[1].reshape(-1)
            order = np.lexsort((-doc_key, -score_array, owner))
            sorted_owner = owner[order]

        starts = np.cumsum(lengths) - lengths
        rank = np.arange(len(order)) - starts[sorted_owner]
        label_array = np.asarray(labels, dtype=np.float64)[order] if labels else np.zeros(0)
        return cls(owner=sorted_owner, rank=rank, labels=label_array, n_queries=len(query_ids))


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
        cumulative = np.cumsum(relevant)
        starts = np.searchsorted(ranked.owner, np.arange(n))
        before = np.where(starts > 0, cumulative[np.maximum(starts - 1, 0)], 0)
        precision_at_rank = (cumulative - before[ranked.owner]) / (ranked.rank + 1.0)
        summed = np.bincount(ranked.owner, weights=precision_at_rank * relevant, minlength=n)
        np.divide(summed, num_relevant, out=values, where=num_relevant > 0)
        return values
    if measure.family == "nDCG":
        gains = np.maximum(ranked.labels, 0.0)
        dcg = np.bincount(ranked.owner[in_cutoff], weights=(gains / np.log2(ranked.rank + 2.0))[in_cutoff],
                          minlength=n)
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
