"""Judged@k: the share of a run's top k documents that carry a judgement in the qrels.

A new dense run on a pooled collection (TREC DL's pools were built from the
2019-2020 runs) retrieves documents the assessors never saw; they count as
non-relevant in nDCG@10, so a low Judged@10 beside an nDCG@10 says that
figure is a lower bound, not a loss. The definition is ir-measures' ``Judged@k``:
a judgement of any label (0 included) counts, the denominator is k (a query
retrieving fewer than k documents is not rewarded for it), the documents are
ranked as trec_eval ranks them, and the average is over the queries of the
qrels (a query missing from the run scores 0).
"""

from __future__ import annotations

from typing import Mapping

from qac.evaluation.metrics import trec_order


def judged_at_k(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]],
                k: int = 10) -> dict[str, float]:
    """``{qid: share of the top k with a judgement}`` for every query with judgements in ``qrels``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    values = {}
    for qid, judged in qrels.items():
        if not judged:
            continue
        top = trec_order(run.get(qid, {}))[:k]
        values[qid] = sum(1 for doc in top if doc in judged) / k
    return values
